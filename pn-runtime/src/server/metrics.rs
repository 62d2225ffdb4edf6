//! Server metrics in the Prometheus text format (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Width of the window the current throughput is measured over.
const WINDOW_SECS: u64 = 10;

/// Upper bounds of the batch-size histogram's buckets (sequences per forward pass).
const BATCH_BUCKETS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Counters updated by the handlers and the slot workers.
#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    tokens_generated: AtomicU64,
    prompt_tokens_processed: AtomicU64,
    prompt_tokens_cached: AtomicU64,
    /// Nanoseconds the slots spent generating (sum over slots).
    generation_nanos: AtomicU64,
    prompt_nanos: AtomicU64,
    ttft_nanos: AtomicU64,
    ttft_count: AtomicU64,
    cancelled: AtomicU64,
    panics: AtomicU64,
    /// Tokens generated per second of uptime, for the last `WINDOW_SECS` seconds.
    window: Mutex<[(u64, u64); WINDOW_SECS as usize]>,
    /// Batched steps: per bucket of [`BATCH_BUCKETS`] (and one past the last) the steps of at
    /// most that many sequences (not cumulative; summed when rendered).
    batch_buckets: [AtomicU64; BATCH_BUCKETS.len() + 1],
    /// Sequences summed over steps.
    batch_sequences: AtomicU64,
    /// Rows (decode rows and prefill chunk rows) summed over steps.
    batch_rows: AtomicU64,
    /// Sequences in the last step.
    batch_last: AtomicU64,
    /// Speculative decoding of finished requests: draft tokens proposed, accepted, and
    /// verification passes (summed over requests).
    spec_drafted: AtomicU64,
    spec_accepted: AtomicU64,
    spec_passes: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            requests: Mutex::default(),
            tokens_generated: AtomicU64::new(0),
            prompt_tokens_processed: AtomicU64::new(0),
            prompt_tokens_cached: AtomicU64::new(0),
            generation_nanos: AtomicU64::new(0),
            prompt_nanos: AtomicU64::new(0),
            ttft_nanos: AtomicU64::new(0),
            ttft_count: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            window: Mutex::new([(u64::MAX, 0); WINDOW_SECS as usize]),
            batch_buckets: Default::default(),
            batch_sequences: AtomicU64::new(0),
            batch_rows: AtomicU64::new(0),
            batch_last: AtomicU64::new(0),
            spec_drafted: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            spec_passes: AtomicU64::new(0),
        }
    }
}

/// Gauges read from the scheduler at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    /// Requests waiting for a slot.
    pub queue_depth: usize,
    /// Slots generating.
    pub busy_slots: usize,
    /// Slots in all.
    pub slots: usize,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Metrics {
    /// Counts a finished HTTP request.
    pub fn record_request(&self, path: &str, status: u16) {
        // Unknown paths share one label so a scanner cannot grow the map without bound.
        let path = match path {
            "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/health" | "/metrics" => {
                path
            }
            _ => "other",
        };
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((path.to_string(), status)).or_default() += 1;
    }

    /// Counts one generated token.
    pub fn record_token(&self) {
        self.tokens_generated.fetch_add(1, Ordering::Relaxed);
        let sec = self.started.elapsed().as_secs();
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut w[(sec % WINDOW_SECS) as usize];
        if slot.0 != sec {
            *slot = (sec, 0);
        }
        slot.1 += 1;
    }

    /// Records a finished generation's prompt and generation work.
    pub fn record_generation(
        &self,
        processed: usize,
        cached: usize,
        prompt_time: Duration,
        generation_time: Duration,
    ) {
        self.prompt_tokens_processed
            .fetch_add(processed as u64, Ordering::Relaxed);
        self.prompt_tokens_cached
            .fetch_add(cached as u64, Ordering::Relaxed);
        self.prompt_nanos
            .fetch_add(nanos(prompt_time), Ordering::Relaxed);
        self.generation_nanos
            .fetch_add(nanos(generation_time), Ordering::Relaxed);
    }

    /// Records a time to first token.
    pub fn record_ttft(&self, d: Duration) {
        self.ttft_nanos.fetch_add(nanos(d), Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a generation cancelled (client gone or shutdown).
    pub fn record_cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one batched forward pass over `sequences` sequences and `rows` rows.
    pub fn record_step(&self, sequences: usize, rows: usize) {
        let n = sequences as u64;
        let b = BATCH_BUCKETS
            .iter()
            .position(|&le| n <= le)
            .unwrap_or(BATCH_BUCKETS.len());
        self.batch_buckets[b].fetch_add(1, Ordering::Relaxed);
        self.batch_sequences.fetch_add(n, Ordering::Relaxed);
        self.batch_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.batch_last.store(n, Ordering::Relaxed);
    }

    /// Adds a finished request's speculative decoding counters.
    pub fn record_spec(&self, stats: &crate::speculative::SpecStats) {
        self.spec_drafted
            .fetch_add(stats.drafted, Ordering::Relaxed);
        self.spec_accepted
            .fetch_add(stats.accepted, Ordering::Relaxed);
        self.spec_passes
            .fetch_add(stats.target_passes, Ordering::Relaxed);
    }

    /// The batch-size histogram and its companions, in the text format.
    fn render_batch(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP pn_batch_size Sequences decoded together per forward pass (batch size per step).\n# TYPE pn_batch_size histogram"
        );
        let mut cumulative = 0;
        for (i, b) in self.batch_buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            let le = BATCH_BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |v| v.to_string());
            let _ = writeln!(s, "pn_batch_size_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.batch_sequences.load(Ordering::Relaxed);
        let _ = writeln!(
            s,
            "pn_batch_size_sum {sum}\npn_batch_size_count {cumulative}"
        );
        let _ = writeln!(
            s,
            "# HELP pn_batch_rows_total Rows run through the model by batched steps (decode rows and prefill chunk rows).\n# TYPE pn_batch_rows_total counter\npn_batch_rows_total {}",
            self.batch_rows.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP pn_batch_size_last Sequences in the last batched step.\n# TYPE pn_batch_size_last gauge\npn_batch_size_last {}",
            self.batch_last.load(Ordering::Relaxed)
        );
        for (name, help, v) in [
            (
                "pn_spec_drafted_total",
                "MTP draft tokens proposed (finished requests).",
                &self.spec_drafted,
            ),
            (
                "pn_spec_accepted_total",
                "MTP draft tokens accepted (finished requests).",
                &self.spec_accepted,
            ),
            (
                "pn_spec_verify_passes_total",
                "Speculative verification steps (finished requests); tokens per step = 1 + accepted / steps.",
                &self.spec_passes,
            ),
        ] {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
    }

    /// Counts a request whose worker panicked.
    pub fn record_panic(&self) {
        self.panics.fetch_add(1, Ordering::Relaxed);
    }

    /// Tokens generated over the last full `WINDOW_SECS` seconds, per second.
    fn recent_tokens_per_sec(&self) -> f64 {
        let now = self.started.elapsed().as_secs();
        let w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        // The current second is still filling: count the `WINDOW_SECS - 1` before it.
        let span = (WINDOW_SECS - 1).min(now).max(1);
        let total: u64 = w
            .iter()
            .filter(|(s, _)| *s != u64::MAX && *s < now && now - *s <= span)
            .map(|(_, n)| n)
            .sum();
        total as f64 / span as f64
    }

    /// The Prometheus text exposition.
    pub fn render(&self, g: Gauges) -> String {
        let mut s = String::new();
        let secs = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 / 1e9;
        let tokens = self.tokens_generated.load(Ordering::Relaxed);
        let gen_secs = secs(&self.generation_nanos);
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        metric(
            "pn_tokens_generated_total",
            "counter",
            "Tokens generated.",
            tokens.to_string(),
        );
        metric(
            "pn_prompt_tokens_processed_total",
            "counter",
            "Prompt tokens run through the model.",
            self.prompt_tokens_processed
                .load(Ordering::Relaxed)
                .to_string(),
        );
        metric(
            "pn_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache instead of processed.",
            self.prompt_tokens_cached
                .load(Ordering::Relaxed)
                .to_string(),
        );
        metric(
            "pn_generation_seconds_total",
            "counter",
            "Seconds slots spent generating (summed over slots).",
            format!("{gen_secs:.6}"),
        );
        metric(
            "pn_prompt_seconds_total",
            "counter",
            "Seconds slots spent processing prompts (summed over slots).",
            format!("{:.6}", secs(&self.prompt_nanos)),
        );
        metric(
            "pn_decode_tokens_per_second",
            "gauge",
            "Per-slot generation speed of finished requests (tokens over generation time).",
            format!(
                "{:.3}",
                if gen_secs > 0.0 {
                    tokens as f64 / gen_secs
                } else {
                    0.0
                }
            ),
        );
        metric(
            "pn_tokens_per_second",
            "gauge",
            "Tokens generated per second by all slots together over the last 10 s.",
            format!("{:.3}", self.recent_tokens_per_sec()),
        );
        metric(
            "pn_time_to_first_token_seconds_sum",
            "counter",
            "Sum of times from request arrival to the first token.",
            format!("{:.6}", secs(&self.ttft_nanos)),
        );
        metric(
            "pn_time_to_first_token_seconds_count",
            "counter",
            "Requests that produced a first token.",
            self.ttft_count.load(Ordering::Relaxed).to_string(),
        );
        metric(
            "pn_queue_depth",
            "gauge",
            "Requests waiting for a free slot.",
            g.queue_depth.to_string(),
        );
        metric(
            "pn_slots_busy",
            "gauge",
            "Slots generating now.",
            g.busy_slots.to_string(),
        );
        metric(
            "pn_slots_total",
            "gauge",
            "Slots (--parallel).",
            g.slots.to_string(),
        );
        metric(
            "pn_requests_cancelled_total",
            "counter",
            "Generations cancelled because the client went away or the server shut down.",
            self.cancelled.load(Ordering::Relaxed).to_string(),
        );
        metric(
            "pn_request_panics_total",
            "counter",
            "Requests whose generation panicked (answered with a 500; the server went on).",
            self.panics.load(Ordering::Relaxed).to_string(),
        );
        self.render_batch(&mut s);
        let _ = writeln!(
            s,
            "# HELP pn_http_requests_total HTTP requests by path and status.\n# TYPE pn_http_requests_total counter"
        );
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for ((path, status), n) in m.iter() {
            let _ = writeln!(
                s,
                "pn_http_requests_total{{path=\"{path}\",status=\"{status}\"}} {n}"
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::default();
        m.record_request("/v1/completions", 200);
        m.record_request("/v1/completions", 200);
        m.record_request("/etc/passwd", 404);
        for _ in 0..5 {
            m.record_token();
        }
        m.record_generation(7, 3, Duration::from_millis(5), Duration::from_millis(50));
        let text = m.render(Gauges {
            queue_depth: 4,
            busy_slots: 2,
            slots: 2,
        });
        assert!(text.contains("pn_tokens_generated_total 5\n"), "{text}");
        assert!(text.contains("pn_prompt_tokens_cached_total 3\n"));
        assert!(text.contains("pn_queue_depth 4\n"));
        assert!(text.contains("pn_decode_tokens_per_second 100.000\n"));
        assert!(
            text.contains("pn_http_requests_total{path=\"/v1/completions\",status=\"200\"} 2\n")
        );
        assert!(text.contains("pn_http_requests_total{path=\"other\",status=\"404\"} 1\n"));
    }

    #[test]
    fn batch_size_histogram_counts_steps_per_bucket() {
        let m = Metrics::default();
        for (seqs, rows) in [(1, 1), (3, 3), (4, 68), (9, 9)] {
            m.record_step(seqs, rows);
        }
        let text = m.render(Gauges::default());
        for line in [
            "pn_batch_size_bucket{le=\"1\"} 1\n",
            "pn_batch_size_bucket{le=\"2\"} 1\n",
            "pn_batch_size_bucket{le=\"4\"} 3\n",
            "pn_batch_size_bucket{le=\"8\"} 3\n",
            "pn_batch_size_bucket{le=\"16\"} 4\n",
            "pn_batch_size_bucket{le=\"+Inf\"} 4\n",
            "pn_batch_size_sum 17\n",
            "pn_batch_size_count 4\n",
            "pn_batch_rows_total 81\n",
            "pn_batch_size_last 9\n",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
