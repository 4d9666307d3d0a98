//! Reports: a phase against its baseline, as a table or one JSON object.

use super::*;

pub(crate) fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// A scenario and its baseline, as JSON or as a table.
pub(crate) struct Report {
    pub(crate) scenario: &'static str,
    pub(crate) clients: usize,
    pub(crate) main: PhaseStats,
    pub(crate) baseline: PhaseStats,
    /// Scenario-specific fields, added to the JSON and listed under the table.
    pub(crate) details: Map<String, JsonValue>,
}

impl Report {
    pub(crate) fn ratio(&self) -> f64 {
        let base = self.baseline.requests_per_sec();
        if base > 0.0 {
            self.main.requests_per_sec() / base
        } else {
            0.0
        }
    }

    pub(crate) fn ok(&self) -> bool {
        self.main.errors == 0 && self.baseline.errors == 0
    }

    pub(crate) fn to_json(&self) -> JsonValue {
        let main = Latency::of(&self.main.histogram);
        let base = Latency::of(&self.baseline.histogram);
        let mut out = json!({
            "scenario": self.scenario,
            "clients": self.clients,
            "duration_s": round(self.main.elapsed.as_secs_f64(), 3),
            "requests": self.main.requests,
            "errors": self.main.errors,
            "requests_per_sec": round(self.main.requests_per_sec(), 1),
            "mb_per_sec": round(self.main.mib_per_sec(), 2),
            "p50_us": main.p50_us,
            "p99_us": main.p99_us,
            "p999_us": main.p999_us,
            "max_us": main.max_us,
            "connections": self.main.connections,
            "baseline": {
                "scenario": self.baseline.name,
                "duration_s": round(self.baseline.elapsed.as_secs_f64(), 3),
                "requests": self.baseline.requests,
                "errors": self.baseline.errors,
                "requests_per_sec": round(self.baseline.requests_per_sec(), 1),
                "p50_us": base.p50_us,
                "p99_us": base.p99_us,
                "p999_us": base.p999_us,
                "max_us": base.max_us,
                "connections": self.baseline.connections,
            },
            "ratio_to_baseline": round(self.ratio(), 3),
        });
        if let JsonValue::Object(fields) = &mut out {
            fields.extend(self.details.clone());
        }
        out
    }

    pub(crate) fn print_table(&self) {
        println!(
            "{:<8} {:>10} {:>7} {:>12} {:>9} {:>10} {:>10} {:>10} {:>10} {:>6}",
            "phase",
            "requests",
            "errors",
            "requests/s",
            "MiB/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
            "conns"
        );
        for phase in [&self.main, &self.baseline] {
            let latency = Latency::of(&phase.histogram);
            println!(
                "{:<8} {:>10} {:>7} {:>12.1} {:>9.2} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>6}",
                phase.name,
                phase.requests,
                phase.errors,
                phase.requests_per_sec(),
                phase.mib_per_sec(),
                latency.p50_us,
                latency.p99_us,
                latency.p999_us,
                latency.max_us,
                phase.connections
            );
        }
        println!(
            "{} with {} clients over {:.2} s: {:.1} % of the {} baseline's requests/s",
            self.scenario,
            self.clients,
            self.main.elapsed.as_secs_f64(),
            100.0 * self.ratio(),
            self.baseline.name
        );
        for (name, value) in &self.details {
            match value {
                JsonValue::String(text) => println!("  {name}: {text}"),
                other => println!("  {name}: {other}"),
            }
        }
    }

    /// Prints the report; true if nothing failed.
    pub(crate) fn print(&self, json: bool) -> bool {
        if json {
            println!("{}", self.to_json());
        } else {
            self.print_table();
        }
        if !self.ok() {
            eprintln!(
                "pagebench: {} failed requests ({} in {}, {} in the baseline)",
                self.main.errors + self.baseline.errors,
                self.main.errors,
                self.scenario,
                self.baseline.errors
            );
        }
        self.ok()
    }
}

pub(crate) fn check_run_args(run: &RunArgs, pages: &PageArgs) -> anyhow::Result<()> {
    if run.clients == 0 {
        bail!("--clients must be at least 1");
    }
    if run.duration.is_zero() {
        bail!("--duration must be more than zero");
    }
    if pages.keys == 0 {
        bail!("--keys must be at least 1");
    }
    Ok(())
}
