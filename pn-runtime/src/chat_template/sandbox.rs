//! Rendering a chat template in a child process with an address-space limit.
//!
//! Fuel bounds almost everything a template can do, but minijinja 3.1 materialises a list
//! concatenation nested more than 32 deep without charging fuel (see the module docs of
//! [`chat_template`](super)), and no hook inside the library can stop that allocation. A
//! process can, though: the worker lowers its own `RLIMIT_AS` before reading anything, so
//! such a template makes the worker's allocation fail (the worker aborts) while the parent
//! only sees a typed [`ChatTemplateError::SandboxMemory`].
//!
//! Protocol: the parent starts `program args...` with the limits in the
//! [`LIMITS_ENV`] variable, writes one JSON request on its stdin (template source, limits,
//! special-token variables and the context, encoded so that every value comes back with the
//! same kind, key order and number type), and reads one JSON reply from its stdout: the text,
//! or the error the in-process renderer gave. The worker renders with the very code of
//! [`ChatTemplate::render`] in its in-process mode, so the output is byte-identical.

use super::{ChatTemplate, ChatTemplateError, TemplateContext, TemplateLimits};
use minijinja::value::{Tuple, ValueKind};
use minijinja::Value;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The first argument that makes `pn` run [`run_worker`] (hidden from `--help`).
pub const WORKER_ARG: &str = "__template-worker";

/// Environment variable carrying `MEMORY_BYTES,CPU_SECONDS` to the worker, read before
/// anything else so the limits are in force while the request is parsed.
pub const LIMITS_ENV: &str = "PN_TEMPLATE_WORKER_LIMITS";

/// Where templates are rendered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TemplateIsolation {
    /// In this process: fastest, and right for trusted templates. A hostile template can
    /// still exhaust memory through nested list concatenation (see the module docs of
    /// [`chat_template`](super)).
    #[default]
    InProcess,
    /// In a child process with a memory and time limit; the choice for templates from model
    /// files one did not make.
    Subprocess(SubprocessSandbox),
}

/// A child process that renders one template per run, under an address-space limit and a
/// timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubprocessSandbox {
    /// The worker program; it must behave like `pn __template-worker` (see [`run_worker`]).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Address-space limit of the worker (`RLIMIT_AS`), in bytes, for a small request; each
    /// render adds [`REQUEST_HEADROOM`](Self::REQUEST_HEADROOM) times its request size, so a
    /// long conversation is not refused for its own size.
    pub memory_limit_bytes: u64,
    /// Wall-clock limit of one render, process start included; the worker also gets a CPU
    /// time limit one second longer (`RLIMIT_CPU`), in case the parent cannot kill it.
    pub timeout: Duration,
}

impl SubprocessSandbox {
    /// Default [`memory_limit_bytes`](Self::memory_limit_bytes): 128 MiB. The worker starts
    /// at about 16 MiB of address space and a real template needs a few MiB more; the limit is
    /// kept small because the list materialisation it stops is slow (minijinja fetches each
    /// item through 32 nested lazy lists, about half a microsecond per 24-byte value), so the
    /// limit is reached in about 2 s at 128 MiB but only after about 20 s at 1 GiB.
    pub const DEFAULT_MEMORY_LIMIT: u64 = 128 << 20;
    /// Bytes of address space granted per byte of request on top of
    /// [`memory_limit_bytes`](Self::memory_limit_bytes): the worker holds the request text,
    /// its parsed form and the template values built from it.
    pub const REQUEST_HEADROOM: u64 = 4;
    /// Default [`timeout`](Self::timeout): 10 s; real templates render in milliseconds, and
    /// the fuel budget stops a long-running one in about a second.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// `program args...` as the worker, with the default limits.
    pub fn new(program: impl Into<PathBuf>, args: Vec<OsString>) -> Self {
        SubprocessSandbox {
            program: program.into(),
            args,
            memory_limit_bytes: Self::DEFAULT_MEMORY_LIMIT,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// This executable as the worker (`<current exe> __template-worker`): for binaries whose
    /// `main` calls [`run_worker`] when its first argument is [`WORKER_ARG`], as `pn` does.
    pub fn current_exe() -> Result<Self, ChatTemplateError> {
        let exe = std::env::current_exe().map_err(|e| ChatTemplateError::SandboxFailed {
            reason: format!("cannot find this executable to run as the template worker: {e}"),
        })?;
        Ok(Self::new(exe, vec![OsString::from(WORKER_ARG)]))
    }

    /// The same sandbox with another memory limit.
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit_bytes = bytes;
        self
    }

    /// The same sandbox with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// CPU seconds the worker may use: the timeout rounded up, plus one.
    fn cpu_seconds(&self) -> u64 {
        self.timeout
            .as_secs()
            .saturating_add(u64::from(self.timeout.subsec_nanos() > 0))
            .saturating_add(1)
    }

    /// Renders `template` with `ctx` in a fresh worker.
    pub(super) fn render(
        &self,
        template: &ChatTemplate,
        ctx: &TemplateContext,
    ) -> Result<String, ChatTemplateError> {
        let request = Request::new(template, ctx)?;
        let body = serde_json::to_vec(&request).map_err(|e| ChatTemplateError::SandboxFailed {
            reason: format!("cannot encode the render request: {e}"),
        })?;
        drop(request);
        let memory_limit = self.memory_limit_bytes.saturating_add(
            Self::REQUEST_HEADROOM.saturating_mul(u64::try_from(body.len()).unwrap_or(u64::MAX)),
        );
        // JSON escapes at most 6 bytes per output byte; a reply beyond that is not ours.
        let reply_cap = template
            .limits
            .max_output_bytes
            .saturating_mul(6)
            .saturating_add(1 << 20);
        let run = self.run(body, memory_limit, reply_cap)?;
        self.interpret(run, memory_limit)
    }

    /// Starts the worker, feeds it `body` and collects its stdout and stderr, killing it when
    /// the timeout passes.
    fn run(
        &self,
        body: Vec<u8>,
        memory_limit: u64,
        reply_cap: usize,
    ) -> Result<Finished, ChatTemplateError> {
        let start = Instant::now();
        // A timeout too large for the clock means no timeout (the CPU limit still holds).
        let deadline = start
            .checked_add(self.timeout)
            .unwrap_or_else(|| start + Duration::from_secs(1 << 32));
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .env(LIMITS_ENV, format!("{memory_limit},{}", self.cpu_seconds()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ChatTemplateError::SandboxFailed {
                reason: format!(
                    "cannot start the template worker {}: {e}",
                    self.program.display()
                ),
            })?;

        // Writing, reading stdout and reading stderr each get a thread, so that a worker
        // blocked on one pipe never deadlocks against a parent blocked on another.
        let stdin = child.stdin.take();
        std::thread::spawn(move || {
            if let Some(mut stdin) = stdin {
                // A worker that exits early closes the pipe: its exit status tells why.
                let _ = stdin.write_all(&body);
            }
        });
        let stdout = spawn_reader(child.stdout.take(), reply_cap);
        let stderr = spawn_reader(child.stderr.take(), STDERR_CAP);

        // The worker closes stdout when it exits (or when it is killed).
        let reply = match stdout.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(reply) => reply,
            Err(_) => return Err(self.kill(&mut child)),
        };
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => return Err(self.kill(&mut child)),
                Ok(None) => std::thread::sleep(Duration::from_micros(200)),
                Err(e) => {
                    let _ = self.kill(&mut child);
                    return Err(ChatTemplateError::SandboxFailed {
                        reason: format!("cannot wait for the template worker: {e}"),
                    });
                }
            }
        };
        let stderr = stderr
            .recv_timeout(Duration::from_millis(500))
            .map(|c| String::from_utf8_lossy(&c.bytes).into_owned())
            .unwrap_or_default();
        Ok(Finished {
            status,
            reply,
            stderr,
        })
    }

    /// Kills and reaps the worker (no zombie stays behind) and names the timeout.
    fn kill(&self, child: &mut Child) -> ChatTemplateError {
        let _ = child.kill();
        let _ = child.wait();
        ChatTemplateError::SandboxTimeout {
            secs: self.timeout.as_secs_f64(),
        }
    }

    /// Turns what the worker left into the rendered text or a typed error.
    fn interpret(&self, run: Finished, memory_limit: u64) -> Result<String, ChatTemplateError> {
        if !run.reply.truncated {
            if let Ok(reply) = serde_json::from_slice::<Reply>(&run.reply.bytes) {
                return match reply {
                    Reply::Text(text) => Ok(text),
                    Reply::Error(e) => Err(e.into_error()),
                };
            }
        }
        let stderr = run.stderr.trim();
        match death(run.status) {
            Some(Death::CpuLimit) => {
                return Err(ChatTemplateError::SandboxTimeout {
                    secs: self.cpu_seconds() as f64,
                })
            }
            Some(Death::Memory) => {
                return Err(ChatTemplateError::SandboxMemory {
                    limit: memory_limit,
                })
            }
            None => {}
        }
        if stderr.contains("memory allocation of") || stderr.contains("out of memory") {
            return Err(ChatTemplateError::SandboxMemory {
                limit: memory_limit,
            });
        }
        let what = if run.reply.truncated {
            "sent a reply larger than the output limit allows".to_string()
        } else if run.status.success() {
            "sent no valid reply".to_string()
        } else {
            format!("failed ({})", run.status)
        };
        let stderr = if stderr.is_empty() {
            String::new()
        } else {
            format!(": {stderr}")
        };
        Err(ChatTemplateError::SandboxFailed {
            reason: format!(
                "the template worker {} {what}{stderr}",
                self.program.display()
            ),
        })
    }
}

/// Most stderr bytes kept from a worker (its messages are one or two lines).
const STDERR_CAP: usize = 16 << 10;

/// A finished worker's exit status and output.
struct Finished {
    status: ExitStatus,
    reply: Captured,
    stderr: String,
}

/// The first `cap` bytes of a pipe, and whether there were more.
struct Captured {
    bytes: Vec<u8>,
    truncated: bool,
}

/// Reads `pipe` to its end on a thread, keeping at most `cap` bytes (the rest is drained so
/// the writer never blocks), and sends the result when the pipe closes.
fn spawn_reader<R: Read + Send + 'static>(pipe: Option<R>, cap: usize) -> mpsc::Receiver<Captured> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut captured = Captured {
            bytes: Vec::new(),
            truncated: false,
        };
        if let Some(mut pipe) = pipe {
            let mut chunk = [0u8; 64 << 10];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let room = cap - captured.bytes.len();
                        captured.bytes.extend_from_slice(&chunk[..n.min(room)]);
                        captured.truncated |= n > room;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
        let _ = tx.send(captured);
    });
    rx
}

/// How a worker that left no reply ended, as far as the limits are concerned.
enum Death {
    /// It used up its CPU time (SIGXCPU).
    CpuLimit,
    /// The allocator aborted when the address-space limit refused memory (SIGABRT), a stack
    /// could not grow (SIGSEGV, SIGBUS), or the kernel's OOM killer struck (SIGKILL).
    Memory,
}

#[cfg(unix)]
fn death(status: ExitStatus) -> Option<Death> {
    match std::os::unix::process::ExitStatusExt::signal(&status)? {
        libc::SIGXCPU => Some(Death::CpuLimit),
        libc::SIGABRT | libc::SIGSEGV | libc::SIGBUS | libc::SIGKILL => Some(Death::Memory),
        _ => None,
    }
}

#[cfg(not(unix))]
fn death(_status: ExitStatus) -> Option<Death> {
    None
}

/// One render, as sent to the worker.
#[derive(Serialize, Deserialize)]
struct Request {
    source: String,
    fuel: u64,
    max_output_bytes: usize,
    recursion_limit: usize,
    special_tokens: Vec<(String, String)>,
    vars: Vec<(String, Vec<Node>)>,
}

impl Request {
    fn new(template: &ChatTemplate, ctx: &TemplateContext) -> Result<Request, ChatTemplateError> {
        let source = template
            .env
            .get_template(super::TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Syntax(super::error_text(&e)))?
            .source()
            .to_string();
        let mut vars = Vec::with_capacity(ctx.vars.len());
        for (name, value) in &ctx.vars {
            let mut nodes = Vec::new();
            encode(value, &mut nodes, 0).map_err(|reason| ChatTemplateError::SandboxFailed {
                reason: format!("cannot pass variable `{name}` to the template worker: {reason}"),
            })?;
            vars.push((name.clone(), nodes));
        }
        Ok(Request {
            source,
            fuel: template.limits.fuel,
            max_output_bytes: template.limits.max_output_bytes,
            recursion_limit: template.limits.recursion_limit,
            special_tokens: template.special_tokens.clone(),
            vars,
        })
    }

    /// Renders the request in this process, exactly as the parent would have.
    fn render(self) -> Result<String, ChatTemplateError> {
        let limits = TemplateLimits {
            fuel: self.fuel,
            max_output_bytes: self.max_output_bytes,
            recursion_limit: self.recursion_limit,
        };
        let mut template = ChatTemplate::with_limits(&self.source, limits)?;
        template.special_tokens = self.special_tokens;
        let mut vars = Vec::with_capacity(self.vars.len());
        for (name, nodes) in self.vars {
            let mut pos = 0;
            let value =
                decode(&nodes, &mut pos, 0).map_err(|reason| ChatTemplateError::SandboxFailed {
                    reason: format!("bad variable `{name}` in the render request: {reason}"),
                })?;
            vars.push((name, value));
        }
        template.render_in_process(&TemplateContext { vars })
    }
}

/// A template value flattened in pre-order: containers give their length and are followed
/// by their items (maps: key, value, key, value...). Flat, so the JSON stays shallow however
/// deep the value is, and tagged, so that `1` and `1.0`, safe and plain strings, tuples and
/// lists, and non-string map keys all survive the trip.
#[derive(Debug, Serialize, Deserialize)]
enum Node {
    Undefined,
    None,
    Bool(bool),
    I64(i64),
    U64(u64),
    /// An `i128`/`u128` in decimal (JSON numbers cannot hold them).
    Wide(String),
    /// The bits of an `f64` (JSON has no NaN or infinity).
    F64(u64),
    Str(String),
    Safe(String),
    Bytes(Vec<u8>),
    Seq(usize),
    Tuple(usize),
    Map(usize),
}

/// Deepest value passed to the worker (JSON input is limited to 128 levels anyway).
const MAX_DEPTH: usize = 512;

fn encode(v: &Value, out: &mut Vec<Node>, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH}"));
    }
    let unsupported = || format!("unsupported {} value", v.kind());
    match v.kind() {
        ValueKind::Undefined => out.push(Node::Undefined),
        ValueKind::None => out.push(Node::None),
        ValueKind::Bool => out.push(Node::Bool(v.is_true())),
        ValueKind::Number if v.is_integer() => out.push(if let Ok(i) = i64::try_from(v.clone()) {
            Node::I64(i)
        } else if let Ok(u) = u64::try_from(v.clone()) {
            Node::U64(u)
        } else if let Ok(i) = i128::try_from(v.clone()) {
            Node::Wide(i.to_string())
        } else if let Ok(u) = u128::try_from(v.clone()) {
            Node::Wide(u.to_string())
        } else {
            return Err(unsupported());
        }),
        ValueKind::Number => {
            let f = f64::try_from(v.clone()).map_err(|_| unsupported())?;
            out.push(Node::F64(f.to_bits()));
        }
        ValueKind::String => {
            let s = v.as_str().ok_or_else(unsupported)?.to_string();
            out.push(if v.is_safe() {
                Node::Safe(s)
            } else {
                Node::Str(s)
            });
        }
        ValueKind::Bytes => out.push(Node::Bytes(v.as_bytes().ok_or_else(unsupported)?.to_vec())),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter().map_err(|e| e.to_string())?.collect();
            out.push(if v.is_tuple() {
                Node::Tuple(items.len())
            } else {
                Node::Seq(items.len())
            });
            for item in &items {
                encode(item, out, depth + 1)?;
            }
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter().map_err(|e| e.to_string())?.collect();
            out.push(Node::Map(keys.len()));
            for key in keys {
                let item = v.get_item(&key).map_err(|e| e.to_string())?;
                encode(&key, out, depth + 1)?;
                encode(&item, out, depth + 1)?;
            }
        }
        _ => return Err(unsupported()),
    }
    Ok(())
}

fn decode(nodes: &[Node], pos: &mut usize, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH}"));
    }
    let node = nodes.get(*pos).ok_or("truncated value")?;
    *pos += 1;
    // A length cannot exceed the nodes left, so a bad request cannot make us over-allocate.
    let items = |n: usize, pos: &mut usize| -> Result<Vec<Value>, String> {
        let mut v = Vec::with_capacity(n.min(nodes.len()));
        for _ in 0..n {
            v.push(decode(nodes, pos, depth + 1)?);
        }
        Ok(v)
    };
    Ok(match node {
        Node::Undefined => Value::UNDEFINED,
        Node::None => Value::from(()),
        Node::Bool(b) => Value::from(*b),
        Node::I64(i) => Value::from(*i),
        Node::U64(u) => Value::from(*u),
        Node::Wide(text) => match text.parse::<i128>() {
            Ok(i) => Value::from(i),
            Err(_) => Value::from(text.parse::<u128>().map_err(|e| e.to_string())?),
        },
        Node::F64(bits) => Value::from(f64::from_bits(*bits)),
        Node::Str(s) => Value::from(s.as_str()),
        Node::Safe(s) => Value::from_safe_string(s.clone()),
        Node::Bytes(b) => Value::from_bytes(b.clone()),
        Node::Seq(n) => Value::from(items(*n, pos)?),
        Node::Tuple(n) => Value::from(Tuple::from(items(*n, pos)?)),
        Node::Map(n) => {
            let flat = items(n.saturating_mul(2), pos)?;
            let mut pairs = Vec::with_capacity(*n);
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            Value::from_pairs(pairs)
        }
    })
}

/// The worker's answer.
#[derive(Serialize, Deserialize)]
enum Reply {
    Text(String),
    Error(WireError),
}

/// A [`ChatTemplateError`] the in-process renderer can give, as sent back by the worker.
#[derive(Serialize, Deserialize)]
enum WireError {
    Missing,
    Syntax(String),
    Raised(String),
    OutOfFuel(u64),
    OutputTooLarge(usize),
    Render(String),
    Json { what: String, reason: String },
    Other(String),
}

impl WireError {
    fn from_error(e: ChatTemplateError) -> WireError {
        match e {
            ChatTemplateError::Missing => WireError::Missing,
            ChatTemplateError::Syntax(s) => WireError::Syntax(s),
            ChatTemplateError::Raised { message } => WireError::Raised(message),
            ChatTemplateError::OutOfFuel { fuel } => WireError::OutOfFuel(fuel),
            ChatTemplateError::OutputTooLarge { limit } => WireError::OutputTooLarge(limit),
            ChatTemplateError::Render(s) => WireError::Render(s),
            ChatTemplateError::Json { what, reason } => WireError::Json { what, reason },
            other => WireError::Other(other.to_string()),
        }
    }

    fn into_error(self) -> ChatTemplateError {
        match self {
            WireError::Missing => ChatTemplateError::Missing,
            WireError::Syntax(s) => ChatTemplateError::Syntax(s),
            WireError::Raised(message) => ChatTemplateError::Raised { message },
            WireError::OutOfFuel(fuel) => ChatTemplateError::OutOfFuel { fuel },
            WireError::OutputTooLarge(limit) => ChatTemplateError::OutputTooLarge { limit },
            WireError::Render(s) => ChatTemplateError::Render(s),
            WireError::Json { what, reason } => ChatTemplateError::Json { what, reason },
            WireError::Other(reason) => ChatTemplateError::SandboxFailed { reason },
        }
    }
}

/// The worker: lowers its own memory and CPU limits (from [`LIMITS_ENV`], defaults if
/// absent), reads one request on stdin, renders it in-process and writes the reply on
/// stdout. A binary calls this when its first argument is [`WORKER_ARG`], before doing
/// anything else.
///
/// Exit status: success when a reply was written (the template's own errors are replies);
/// failure when the limits cannot be set or the request is unreadable. A template that
/// exceeds the memory limit ends the process with the allocator's abort.
pub fn run_worker() -> ExitCode {
    let (memory, cpu) = std::env::var(LIMITS_ENV)
        .ok()
        .and_then(|s| {
            let (m, c) = s.split_once(',')?;
            Some((m.trim().parse().ok()?, c.trim().parse().ok()?))
        })
        .unwrap_or((
            SubprocessSandbox::DEFAULT_MEMORY_LIMIT,
            SubprocessSandbox::DEFAULT_TIMEOUT.as_secs() + 1,
        ));
    if let Err(e) = lower_limits(memory, cpu) {
        eprintln!("template worker: {e}");
        return ExitCode::from(3);
    }
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut input) {
        eprintln!("template worker: cannot read the request: {e}");
        return ExitCode::from(2);
    }
    let request: Request = match serde_json::from_slice(&input) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("template worker: bad request: {e}");
            return ExitCode::from(2);
        }
    };
    drop(input);
    let reply = match request.render() {
        Ok(text) => Reply::Text(text),
        Err(e) => Reply::Error(WireError::from_error(e)),
    };
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &reply)
        .map_err(std::io::Error::from)
        .and_then(|()| out.flush());
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("template worker: cannot write the reply: {e}");
            ExitCode::from(2)
        }
    }
}

/// Lowers `RLIMIT_AS` to `memory` bytes and `RLIMIT_CPU` to `cpu` seconds (hard limit one
/// more, so the soft one delivers SIGXCPU first), and turns off core dumps (a worker that
/// hits the limit aborts, and a core of it would only cost time and disk). Never raises a
/// limit.
#[cfg(unix)]
fn lower_limits(memory: u64, cpu: u64) -> Result<(), String> {
    fn set(resource: LimitResource, name: &str, soft: u64, hard: u64) -> Result<(), String> {
        let mut current = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
        if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
            return Err(format!(
                "getrlimit({name}): {}",
                std::io::Error::last_os_error()
            ));
        }
        let cap = |want: u64| {
            let want = libc::rlim_t::try_from(want).unwrap_or(libc::RLIM_INFINITY);
            if current.rlim_max == libc::RLIM_INFINITY {
                want
            } else {
                want.min(current.rlim_max)
            }
        };
        let new = libc::rlimit {
            rlim_cur: cap(soft),
            rlim_max: cap(hard),
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(resource, &new) } != 0 {
            return Err(format!(
                "setrlimit({name}): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
    set(libc::RLIMIT_AS, "RLIMIT_AS", memory, memory)?;
    set(libc::RLIMIT_CPU, "RLIMIT_CPU", cpu, cpu.saturating_add(1))?;
    set(libc::RLIMIT_CORE, "RLIMIT_CORE", 0, 0)?;
    Ok(())
}

/// The type glibc's `setrlimit` takes for its resource argument (`c_int` elsewhere).
#[cfg(all(unix, target_env = "gnu"))]
type LimitResource = libc::__rlimit_resource_t;
#[cfg(all(unix, not(target_env = "gnu")))]
type LimitResource = libc::c_int;

#[cfg(not(unix))]
fn lower_limits(_memory: u64, _cpu: u64) -> Result<(), String> {
    Err("the template sandbox needs a Unix system (setrlimit)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: &Value) -> Value {
        let mut nodes = Vec::new();
        encode(v, &mut nodes, 0).unwrap();
        let json = serde_json::to_string(&nodes).unwrap();
        let nodes: Vec<Node> = serde_json::from_str(&json).unwrap();
        let mut pos = 0;
        let back = decode(&nodes, &mut pos, 0).unwrap();
        assert_eq!(pos, nodes.len());
        back
    }

    #[test]
    fn values_survive_the_wire_with_their_kinds() {
        let map = Value::from_pairs([
            (Value::from(2), Value::from(1.0)),
            (Value::from("b"), Value::from_safe_string("<b>".into())),
            (
                Value::from("a"),
                Value::from(Tuple::from(vec![Value::from(1)])),
            ),
        ]);
        let values = [
            Value::UNDEFINED,
            Value::from(()),
            Value::from(true),
            Value::from(-3),
            Value::from(u64::MAX),
            Value::from(i128::MIN),
            Value::from(u128::MAX),
            Value::from(f64::NAN),
            Value::from(-0.0),
            Value::from("é"),
            Value::from_bytes(vec![0, 255]),
            Value::from(vec![map.clone(), Value::from(vec![Value::from(1.5)])]),
            map,
        ];
        for v in values {
            let back = round_trip(&v);
            assert_eq!(format!("{v:?}"), format!("{back:?}"));
            assert_eq!(v.kind(), back.kind());
            assert_eq!(v.is_integer(), back.is_integer());
            assert_eq!(v.is_safe(), back.is_safe());
            assert_eq!(v.is_tuple(), back.is_tuple());
        }
    }

    #[test]
    fn bad_requests_fail_without_allocating() {
        // A length far beyond the nodes present.
        let nodes = [Node::Seq(usize::MAX), Node::None];
        let mut pos = 0;
        assert!(decode(&nodes, &mut pos, 0).is_err());
        let mut pos = 0;
        assert!(decode(&[Node::Map(3)], &mut pos, 0).is_err());
        let mut pos = 0;
        assert!(decode(&[Node::Wide("x".into())], &mut pos, 0).is_err());
    }

    #[test]
    fn cpu_seconds_round_the_timeout_up() {
        let s = SubprocessSandbox::new("pn", Vec::new());
        assert_eq!(s.cpu_seconds(), 11);
        let s = s.with_timeout(Duration::from_millis(300));
        assert_eq!(s.cpu_seconds(), 2);
        assert_eq!(s.with_timeout(Duration::MAX).cpu_seconds(), u64::MAX);
    }
}
