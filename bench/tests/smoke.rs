//! CI smoke test of the benchmark harness: `kd-bench --size tiny` against the
//! debug `kube-discovery` (built by `./test.sh`), so the harness never rots.
//! No timing is asserted; what is asserted are the harness's own invariants
//! (every scenario ran and produced its figures) and the correctness figures
//! the benchmarks exist to watch: every service written with all its
//! endpoints, zero writes from irrelevant changes, zero writes on an idle
//! restart, and convergence after a 410 and an outage.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Runs `kd-bench --size tiny` with `extra` arguments; returns the result
/// JSON and the Markdown report.
fn tiny_run(extra: &[&str]) -> (Value, String) {
    let exe = env!("CARGO_BIN_EXE_kd-bench");
    let ctl = Path::new(exe).with_file_name("kube-discovery");
    assert!(
        ctl.is_file(),
        "{} not found: run `cargo build -p kube-discovery` (./test.sh builds every binary)",
        ctl.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("tiny.json");
    let run = Command::new(exe)
        .args(["--size", "tiny", "--out"])
        .arg(&out)
        .arg("--controller-bin")
        .arg(&ctl)
        .args(extra)
        .output()
        .expect("run kd-bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "kd-bench failed: {stderr}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("result JSON"))
        .expect("valid JSON");
    let md = std::fs::read_to_string(out.with_extension("md")).expect("markdown table");
    assert_eq!(doc["errors"].as_array().map(Vec::len), Some(0), "{doc:#}");
    assert!(doc["machine"]["nproc"].as_u64().is_some_and(|n| n > 0));
    (doc, md)
}

fn runs<'a>(doc: &'a Value, scenario: &str) -> Vec<&'a Value> {
    doc["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter(|r| r["scenario"] == scenario)
        .collect()
}

/// The coalescing scenarios (not in the default set): every change reaches
/// its service, every rollout ends with exactly the new Pods.
#[test]
fn tiny_run_of_the_coalescing_scenarios() {
    let (doc, md) = tiny_run(&["--only", "lone,rollout", "--modes", "slices"]);
    assert!(
        md.contains("### Lone changes") && md.contains("### Rollouts"),
        "{md}"
    );
    let lone = runs(&doc, "lone");
    assert_eq!(lone.len(), 1, "{doc:#}");
    assert_eq!(lone[0]["unreflected"], 0, "{doc:#}");
    assert_eq!(
        lone[0]["latency_ms"]["count"], lone[0]["changes"],
        "{doc:#}"
    );
    let rollouts = runs(&doc, "rollout");
    assert_eq!(rollouts.len(), 2, "paced and burst: {doc:#}");
    for r in rollouts {
        assert_eq!(r["unreflected"], 0, "{r:#}");
        assert_eq!(r["final_state_mismatches"], 0, "{r:#}");
        assert!(r["ds_api_writes"].as_u64().is_some_and(|n| n > 0), "{r:#}");
    }
}

#[test]
fn tiny_run_produces_every_figure() {
    let (doc, md) = tiny_run(&[]);
    assert_eq!(doc["apiserver"], "kube-sim");
    assert!(
        md.contains("### Initial sync")
            && md.contains("### Churn")
            && md.contains("### Restart and recovery"),
        "{md}"
    );
    check_sync_and_churn(&doc, 2);

    let rec = runs(&doc, "recovery");
    assert_eq!(rec.len(), 1);
    assert_eq!(
        rec[0]["idle_restart"]["api_writes"], 0,
        "idle restart wrote: {:#}",
        rec[0]
    );
    assert_eq!(rec[0]["forced_410"]["changed_services"], 10);
    assert!(
        rec[0]["forced_410"]["reconverge_s"].as_f64().is_some(),
        "{:#}",
        rec[0]
    );
    assert!(
        rec[0]["outage"]["reconverge_s"].as_f64().is_some(),
        "{:#}",
        rec[0]
    );

    // Many clusters: every service of every cluster written, nothing on an
    // idle restart, and a cluster away and back rewrites exactly what
    // changed there.
    let multi = runs(&doc, "multi");
    assert_eq!(multi.len(), 1);
    let m = multi[0];
    assert_eq!(m["clusters"], 3, "{m:#}");
    assert!(
        m["first_sync"]["ds_api_writes"]
            .as_u64()
            .is_some_and(|n| n >= 60),
        "3 x 20 services: {m:#}"
    );
    assert_eq!(m["idle_restart"]["ds_api_writes"], 0, "{m:#}");
    let back = &m["cluster_away_and_back"];
    assert_eq!(back["changed_services"], 5, "{m:#}");
    assert_eq!(back["only_the_changed_rewritten"], true, "{m:#}");
    assert!(md.contains("### Many clusters"), "{md}");

    // The churn sweep: every step converged (the rates are tiny).
    let sweep = runs(&doc, "sweep");
    assert_eq!(sweep.len(), 1);
    let steps = sweep[0]["steps"].as_array().expect("steps");
    assert!(!steps.is_empty(), "{:#}", sweep[0]);
    for s in steps {
        assert_eq!(s["controller"]["final_state_mismatches"], 0, "{s:#}");
    }
    assert!(md.contains("### Churn at rising rates"), "{md}");
}

/// The same harness on the real kube-apiserver + etcd (sync and churn; the
/// recovery scenario needs kube-sim's faults in the controller's path).
#[test]
fn tiny_run_on_the_real_api_server() {
    let (doc, md) = tiny_run(&["--apiserver", "real", "--only", "sync,churn"]);
    assert_eq!(doc["apiserver"], "real");
    assert!(
        md.contains("### Initial sync") && md.contains("### Churn"),
        "{md}"
    );
    check_sync_and_churn(&doc, 2);
}

/// The kwok-scale scenario at its tiny size (20 Deployments x 3 Pods, 5
/// rolling) on the real control plane with kwok: the run fails by itself when
/// a DiscoveredService does not equal its ready Pod IPs after a step.
#[test]
fn tiny_kwok_scale_on_the_real_control_plane() {
    let (doc, md) = tiny_run(&["--apiserver", "real", "--only", "kwok-scale"]);
    let r = runs(&doc, "kwok-scale");
    assert_eq!(r.len(), 1, "{doc:#}");
    let r = r[0];
    assert_eq!(r["pods"], 60, "{r:#}");
    assert_eq!(r["rolling"]["pods_replaced"], 15, "{r:#}");
    assert!(
        r["first_sync"]["ds_writes"]
            .as_f64()
            .is_some_and(|n| n >= 20.0),
        "{r:#}"
    );
    for p in [
        "kube-discovery",
        "kube-apiserver",
        "etcd",
        "kube-controller-manager",
    ] {
        assert!(
            r["first_sync"]["usage"][p]["rss_mib"]
                .as_f64()
                .is_some_and(|m| m > 0.0),
            "{p}: {r:#}"
        );
    }
    assert!(md.contains("### kwok scale"), "{md}");
}

/// The xDS scenario (not in the default set; needs `.tools/bin/gcp-server`,
/// built by `e2e/tools/install-xds-go.sh`): 50 services, 5 streams, 50
/// changes, SotW and delta, against the controller and go-control-plane.
/// Every change reaches every stream of both servers, and the figures the
/// benchmark reports are there and plausible.
#[test]
fn tiny_run_of_the_xds_scenario() {
    let (doc, md) = tiny_run(&["--only", "xds", "--modes", "slices"]);
    assert!(md.contains("### xDS: 50 services x 5 endpoints"), "{md}");
    let x = runs(&doc, "xds");
    assert_eq!(x.len(), 1, "{doc:#}");
    let x = x[0];
    assert_eq!(x["failures"].as_array().map(Vec::len), Some(0), "{x:#}");
    let all = x["runs"].as_array().expect("runs");
    let mut seen = Vec::new();
    for r in all {
        seen.push(format!(
            "{} {}",
            r["server"].as_str().unwrap_or(""),
            r["protocol"].as_str().unwrap_or("")
        ));
        assert_eq!(r["streams"], 5, "{r:#}");
        assert_eq!(r["changes"], 50, "{r:#}");
        assert_eq!(
            r["reached_every_stream"], 50,
            "every change on every stream: {r:#}"
        );
        assert_eq!(r["all_held"], true, "{r:#}");
        assert_eq!(
            r["unknown_assignments"], 0,
            "only the planned endpoint sets: {r:#}"
        );
        let lat = &r["latency_last_stream_ms"];
        assert_eq!(lat["count"], 50, "{r:#}");
        let (first, last) = (
            r["latency_first_stream_ms"]["p50"]
                .as_f64()
                .expect("first p50"),
            lat["p50"].as_f64().expect("last p50"),
        );
        assert!(first <= last && last < 60_000.0, "{r:#}");
        assert!(
            r["server_cpu_s"].as_f64().is_some_and(|c| c >= 0.0),
            "{r:#}"
        );
        assert!(
            r["server_rss_mib_max"].as_f64().is_some_and(|m| m > 1.0),
            "{r:#}"
        );
        assert!(r["client_cpu_s"].as_f64().is_some_and(|c| c > 0.0), "{r:#}");
        // At least one assignment per change per stream went over the wire.
        let one = r["assignment_bytes"].as_f64().expect("assignment size");
        assert!(one > 50.0, "{r:#}");
        assert!(
            r["bytes_per_change_per_stream"]
                .as_f64()
                .is_some_and(|b| b >= one * 0.9),
            "{r:#}"
        );
        if r["server"] == "kube-discovery" {
            assert_eq!(r["commits_from_write_log"], 50, "{r:#}");
            assert!(
                r["controller_metrics"]["eds_pushes"]
                    .as_f64()
                    .is_some_and(|n| n >= 5.0),
                "{r:#}"
            );
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "go-control-plane delta",
            "go-control-plane sotw",
            "kube-discovery delta",
            "kube-discovery sotw"
        ],
        "{x:#}"
    );
    assert_eq!(x["targets"].as_array().map(Vec::len), Some(2), "{x:#}");
}

/// Correctness figures of the sync and churn runs (`modes` of each).
fn check_sync_and_churn(doc: &Value, modes: usize) {
    let sync = runs(doc, "sync");
    assert_eq!(sync.len(), modes, "one sync per mode");
    for r in sync {
        assert_eq!(r["content_check"]["ok"], true, "{r:#}");
        assert!(r["sync_s"].as_f64().is_some_and(|s| s > 0.0), "{r:#}");
        assert!(r["peak_rss_mib"].as_f64().is_some_and(|m| m > 0.0), "{r:#}");
        assert!(r["api_requests"].as_u64().is_some_and(|n| n > 0), "{r:#}");
        // 20 services, each written at least once (object and status).
        assert!(
            r["ds_api_writes"].as_u64().is_some_and(|n| n >= 20),
            "{r:#}"
        );
    }

    let churn = runs(doc, "churn");
    assert_eq!(churn.len(), modes, "one churn per mode");
    for r in churn {
        assert!(
            r["relevant_changes"].as_u64().is_some_and(|n| n > 0),
            "{r:#}"
        );
        assert_eq!(
            r["controller"]["ds_api_writes_from_irrelevant"], 0,
            "irrelevant changes caused writes: {r:#}"
        );
        // Coalescing may legitimately skip a change undone inside the window;
        // the end state must match exactly, and the echo client skips nothing.
        assert_eq!(r["controller"]["final_state_mismatches"], 0, "{r:#}");
        assert_eq!(r["echo"]["unreflected_changes"], 0, "{r:#}");
        assert!(
            r["controller"]["latency_ms"]["p99"].as_f64().is_some(),
            "{r:#}"
        );
        assert!(r["echo"]["latency_ms"]["p99"].as_f64().is_some(), "{r:#}");
        assert!(
            r["controller"]["cpu_s"].as_f64().is_some_and(|c| c > 0.0),
            "{r:#}"
        );
    }
}
