"""Writes demo-calib-60.txt: the calibration text of the shipped demo PN3 file.

The corpus and the split are the demo model's (../README.md, "Corpus and license"): the .py files
of CPython 3.11.7's standard library without site-packages/, pydoc_data/ and any test/, tests/,
idle_test/ directory, sorted by relative path; a file is validation iff
int(sha256(relative_path), 16) % 50 == 0. From the 717 training files, every 12th in path order
(60 files) contributes its first lines up to at least 900 bytes, so the 16384 calibration tokens
that `pn quantize --calib` takes come from 60 different files, never a validation file.

Usage: python3 make_demo_calib.py [STDLIB_DIR] > demo-calib-60.txt
"""
import hashlib
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "/root/.pyenv/versions/3.11.7/lib/python3.11"
files = []
for d, _, names in os.walk(root):
    parts = [] if os.path.relpath(d, root) == "." else os.path.relpath(d, root).split(os.sep)
    if parts and parts[0] in ("site-packages", "pydoc_data"):
        continue
    if any(p in ("test", "tests", "idle_test") for p in parts):
        continue
    files += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".py")]
files.sort()
train = [f for f in files if int(hashlib.sha256(f.encode()).hexdigest(), 16) % 50 != 0]
assert len(train) == 717, len(train)
out = sys.stdout
for name in train[::12]:
    with open(os.path.join(root, name), encoding="utf-8", newline="") as fh:
        text = fh.read()
    acc = ""
    for line in text.splitlines(keepends=True):
        acc += line
        if len(acc) >= 900:
            break
    out.write(acc if acc.endswith("\n") else acc + "\n")
