//! Scenario 6 (issue 19, item 3): churn at the floor's rate. The churn
//! scenario ([`crate::scenarios::churn`]: the controller and the echo client
//! watching the same kube-sim, every change timed from its commit to the
//! first write reflecting it) is run at ascending rates until neither client
//! keeps up. At each rate:
//!
//! * the **echo client** keeps up when its p99 latency is <= 50 ms and it
//!   reflected every change;
//! * the **controller** keeps up when its p99 is <= the coalescing window +
//!   50 ms, it reflected every change, and its end state matches the sources;
//! * either only counts when the load generator achieved at least 90 % of
//!   the rate (beyond that the generator, in the same process as kube-sim,
//!   is the bottleneck and the step says nothing about the clients).
//!
//! The highest rate each client kept up with is reported; rates are the
//! steps given, so the true limit lies between that step and the next.

use anyhow::Result;
use serde_json::{Value, json};

use crate::load::Mode;
use crate::scenarios::{ChurnParams, Opts, churn};

/// The echo client's latency bound (issue 19, item 3).
const ECHO_P99_MS: f64 = 50.0;

/// Runs the sweep (see the module docs).
pub async fn sweep(opts: &Opts, mode: Mode, base: &ChurnParams, rates: &[f64]) -> Result<Value> {
    let window = opts.window_ms as f64;
    let mut steps = Vec::new();
    let (mut ctl_max, mut echo_max): (Option<f64>, Option<f64>) = (None, None);
    for &rate in rates {
        eprintln!("kd-bench: sweep {} at {rate}/s ...", mode.as_str());
        let r = churn(
            opts,
            mode,
            &ChurnParams {
                rate,
                ..base.clone()
            },
        )
        .await?;
        let achieved = r["achieved_rate"].as_f64().unwrap_or(0.0);
        let load_ok = achieved >= 0.9 * rate;
        let (c, e) = (&r["controller"], &r["echo"]);
        let p99 = |x: &Value| x["latency_ms"]["p99"].as_f64();
        let echo_ok =
            load_ok && e["unreflected_changes"] == 0 && p99(e).is_some_and(|v| v <= ECHO_P99_MS);
        let ctl_ok = load_ok
            && c["unreflected_changes"] == 0
            && c["final_state_mismatches"] == 0
            && p99(c).is_some_and(|v| v <= window + 50.0);
        if echo_ok {
            echo_max = Some(rate);
        }
        if ctl_ok {
            ctl_max = Some(rate);
        }
        steps.push(json!({
            "target_rate": rate, "achieved_rate": achieved, "load_kept_up": load_ok,
            "controller": {"p99_ms": c["latency_ms"]["p99"], "p50_ms": c["latency_ms"]["p50"], "unreflected": c["unreflected_changes"],
                           "final_state_mismatches": c["final_state_mismatches"], "cpu_s": c["cpu_s"],
                           "api_writes_per_relevant_change": c["api_writes_per_relevant_change"], "kept_up": ctl_ok},
            "echo": {"p99_ms": e["latency_ms"]["p99"], "p50_ms": e["latency_ms"]["p50"], "unreflected": e["unreflected_changes"],
                     "cpu_s": e["cpu_s"], "kept_up": echo_ok},
            "cpu_ratio": r["ratios"]["cpu"],
        }));
        if !echo_ok && !ctl_ok {
            break;
        }
    }
    let cpu_at_500 = steps
        .iter()
        .find(|s| s["target_rate"].as_f64() == Some(500.0))
        .and_then(|s| s["cpu_ratio"].as_f64());
    Ok(json!({
        "scenario": "sweep", "mode": mode.as_str(), "coalesce_window_ms": opts.window_ms,
        "services": base.relevant + base.irrelevant, "endpoints_per_service": base.per,
        "seconds_per_step": base.seconds, "rates": rates, "steps": steps,
        "controller_max_rate": ctl_max, "echo_max_rate": echo_max, "cpu_ratio_at_500": cpu_at_500,
        "targets_met": {
            "controller_sustains_echo_rate": match (ctl_max, echo_max) { (Some(c), Some(e)) => c >= e, (_, None) => true, (None, Some(_)) => false },
            "cpu_le_1_2x_echo_at_500": cpu_at_500.map(|r| r <= 1.2),
        },
    }))
}
