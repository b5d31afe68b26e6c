//! Markdown tables from the result JSON (the same document `--out` writes).

use serde_json::Value;

fn f(v: &Value, digits: usize) -> String {
    match v.as_f64() {
        Some(x) => format!("{x:.digits$}"),
        None => "-".to_string(),
    }
}

fn yes(v: &Value) -> &'static str {
    match v.as_bool() {
        Some(true) => "yes",
        Some(false) => "**NO**",
        None => "-",
    }
}

/// Renders every scenario of `results` (`{"machine":..,"runs":[..]}`).
pub fn markdown(results: &Value) -> String {
    let mut out = String::new();
    let runs = results["runs"].as_array().cloned().unwrap_or_default();
    let of = |s: &str| {
        runs.iter()
            .filter(|r| r["scenario"] == s)
            .cloned()
            .collect::<Vec<_>>()
    };
    let sync = of("sync");
    if !sync.is_empty() {
        out.push_str("### Initial sync\n\n| mode | services x endpoints | endpoints | sync s | /readyz s | peak RSS MiB | RSS B/endpoint | RSS budget MiB | within | API requests | DS API writes | CPU s | content ok |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &sync {
            out.push_str(&format!(
                "| {} | {} x {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r["mode"].as_str().unwrap_or(""),
                r["services"],
                r["endpoints_per_service"],
                r["endpoints"],
                f(&r["sync_s"], 2),
                f(&r["ready_s"], 2),
                f(&r["peak_rss_mib"], 1),
                f(&r["rss_bytes_per_endpoint"], 0),
                f(&r["rss_budget_mib"], 1),
                yes(&r["rss_within_budget"]),
                r["api_requests"],
                r["ds_api_writes"],
                f(&r["cpu_s"], 2),
                yes(&r["content_check"]["ok"]),
            ));
        }
        out.push('\n');
    }
    for r in of("churn") {
        let c = &r["controller"];
        let e = &r["echo"];
        out.push_str(&format!(
            "### Churn ({} mode): {} changes in {:.1} s ({:.0}/s, target {}/s), {} relevant, window {} ms\n\n",
            r["mode"].as_str().unwrap_or(""), r["changes"], r["load_s"].as_f64().unwrap_or(0.0),
            r["achieved_rate"].as_f64().unwrap_or(0.0), r["target_rate"], r["relevant_changes"], r["coalesce_window_ms"],
        ));
        out.push_str("| client | p50 ms | p90 ms | p99 ms | max ms | undone | unreflected | CPU s | CPU s / 1000 changes | max RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for (name, x) in [("kube-discovery", c), ("echo (floor)", e)] {
            out.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                f(&x["latency_ms"]["p50"], 1),
                f(&x["latency_ms"]["p90"], 1),
                f(&x["latency_ms"]["p99"], 1),
                f(&x["latency_ms"]["max"], 1),
                x.get("undone_changes")
                    .map_or_else(|| "-".to_string(), Value::to_string),
                x["unreflected_changes"],
                f(&x["cpu_s"], 2),
                f(&x["cpu_s_per_1000_changes"], 3),
                f(&x["max_rss_mib"], 1),
            ));
        }
        out.push_str(&format!(
            "| ratio controller/echo | {} | | {} | {} | | | {} | | |\n\n",
            f(&r["ratios"]["p50"], 2),
            f(&r["ratios"]["p99"], 2),
            f(&r["ratios"]["max"], 2),
            f(&r["ratios"]["cpu"], 2),
        ));
        out.push_str(&format!(
            "Final state: {} DiscoveredServices differ from the sources after settling. Controller writes: {} applies ({} per relevant change), {} DiscoveredService API writes on changed services ({} per relevant change), **{} from irrelevant changes**; echo: {} API writes.\n\n",
            c["final_state_mismatches"], f(&c["applies_metric"], 0), f(&c["applies_per_relevant_change"], 3), c["ds_api_writes_relevant"],
            f(&c["api_writes_per_relevant_change"], 3), c["ds_api_writes_from_irrelevant"], e["api_writes"],
        ));
        out.push_str(&targets(&r["targets_met"]));
    }
    for r in of("recovery") {
        let i = &r["idle_restart"];
        let g = &r["forced_410"];
        let o = &r["outage"];
        out.push_str(&format!(
            "### Restart and recovery ({} mode, {} services x {})\n\n| event | figure |\n|---|---|\n",
            r["mode"].as_str().unwrap_or(""), r["services"], r["endpoints_per_service"]
        ));
        out.push_str(&format!("| idle restart: API writes | {} |\n| idle restart: /readyz after | {} s |\n| idle restart: API requests | {} |\n| idle restart: RSS MiB | {} |\n", i["api_writes"], f(&i["ready_s"], 2), i["api_requests"], f(&i["rss_mib"], 1)));
        out.push_str(&format!(
            "| forced 410 ({} services changed while the watch stalled): last write after compaction + watch drop | {} s |\n| forced 410: services rewritten | {} |\n| forced 410: relist events (metric) | {} |\n",
            g["changed_services"], f(&g["reconverge_s"], 2), g["services_rewritten"], f(&g["relist_events_metric"], 0)
        ));
        out.push_str(&format!(
            "| {} s outage, then {} changes: last write after the API server answered | {} s |\n\n",
            o["seconds"],
            o["changed_services"],
            f(&o["reconverge_s"], 2)
        ));
        out.push_str(&targets(&r["targets_met"]));
    }
    for r in of("multi") {
        let s = &r["first_sync"];
        let i = &r["idle_restart"];
        let a = &r["cluster_away_and_back"];
        out.push_str(&format!(
            "### Many clusters: {} clusters x {} services x {} endpoints ({} endpoints, EndpointSlices, home = c0)\n\n| event | figure |\n|---|---|\n",
            r["clusters"], r["services_per_cluster"], r["endpoints_per_service"], r["endpoints"]
        ));
        out.push_str(&format!(
            "| first sync: every DiscoveredService written and /readyz 200 | {} s (/readyz {} s) |\n| first sync: peak RSS | {} MiB ({} B/endpoint) |\n| first sync: CPU | {} s |\n| first sync: DiscoveredService API writes | {} |\n",
            f(&s["sync_s"], 1), f(&s["ready_s"], 1), f(&s["peak_rss_mib"], 1), f(&s["rss_bytes_per_endpoint"], 0), f(&s["cpu_s"], 1), s["ds_api_writes"]
        ));
        out.push_str(&format!(
            "| idle restart: DiscoveredService API writes | {} (/readyz after {} s) |\n",
            i["ds_api_writes"],
            f(&i["ready_s"], 2)
        ));
        out.push_str(&format!(
            "| {} away {} s, {} services changed meanwhile: services rewritten | {} (only the changed: {}) |\n| {} back: last write after it answered | {} s |\n\n",
            a["cluster"].as_str().unwrap_or(""), a["outage_s"], a["changed_services"], a["services_rewritten"], yes(&a["only_the_changed_rewritten"]),
            a["cluster"].as_str().unwrap_or(""), f(&a["reconverge_s"], 2)
        ));
        out.push_str(&targets(&r["targets_met"]));
    }
    for r in of("sweep") {
        out.push_str(&format!(
            "### Churn at rising rates ({} mode, {} services x {}, {} s per step, window {} ms)\n\n| target /s | achieved /s | controller p50 / p99 ms | kept up | echo p50 / p99 ms | kept up | CPU controller / echo s | ratio |\n|---|---|---|---|---|---|---|---|\n",
            r["mode"].as_str().unwrap_or(""), r["services"], r["endpoints_per_service"], r["seconds_per_step"], r["coalesce_window_ms"]
        ));
        for s in r["steps"].as_array().into_iter().flatten() {
            let (c, e) = (&s["controller"], &s["echo"]);
            out.push_str(&format!(
                "| {} | {} | {} / {} | {} | {} / {} | {} | {} / {} | {} |\n",
                s["target_rate"],
                f(&s["achieved_rate"], 0),
                f(&c["p50_ms"], 1),
                f(&c["p99_ms"], 1),
                yes(&c["kept_up"]),
                f(&e["p50_ms"], 1),
                f(&e["p99_ms"], 1),
                yes(&e["kept_up"]),
                f(&c["cpu_s"], 2),
                f(&e["cpu_s"], 2),
                f(&s["cpu_ratio"], 2),
            ));
        }
        out.push_str(&format!(
            "\nHighest rate kept up with: controller {}, echo {} changes/s (steps as given).\n\n",
            r["controller_max_rate"], r["echo_max_rate"]
        ));
        out.push_str(&targets(&r["targets_met"]));
    }
    let lone = of("lone");
    if !lone.is_empty() {
        out.push_str("### Lone changes (a quiet service)\n\n| mode | changes | gap ms | p50 ms | p99 ms | max ms | unreflected | DS writes / change |\n|---|---|---|---|---|---|---|---|\n");
        for r in &lone {
            let l = &r["latency_ms"];
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r["mode"].as_str().unwrap_or(""),
                r["changes"],
                r["gap_ms"],
                f(&l["p50"], 1),
                f(&l["p99"], 1),
                f(&l["max"], 1),
                r["unreflected"],
                f(&r["ds_writes_per_change"], 2),
            ));
        }
        out.push('\n');
    }
    let rollout = of("rollout");
    if !rollout.is_empty() {
        out.push_str("### Rollouts (maxSurge 1, maxUnavailable 0)\n\n| variant | mode | services x replicas | startup ms | relevant changes | DS writes | DS writes / rollout | DS writes / relevant change | p50 ms | p99 ms | unreflected | end state wrong |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &rollout {
            let l = &r["latency_ms"];
            out.push_str(&format!(
                "| {} | {} | {} x {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r["variant"].as_str().unwrap_or(""),
                r["mode"].as_str().unwrap_or(""),
                r["services"],
                r["replicas"],
                r["startup_ms"],
                r["relevant_changes"],
                r["ds_api_writes"],
                f(&r["ds_writes_per_rollout"], 2),
                f(&r["ds_writes_per_relevant_change"], 2),
                f(&l["p50"], 1),
                f(&l["p99"], 1),
                r["unreflected"],
                r["final_state_mismatches"],
            ));
        }
        out.push('\n');
    }
    for r in of("gateways") {
        out.push_str(&format!(
            "### How fast the world follows: {} rollouts of {} replicas per gateway (grace {} s, window {} ms)\n\n\
| gateway | Pods | ready -> first request p50 / p99 ms | (a) Pod Ready -> slice | (b) slice -> DiscoveredService | (c) DiscoveredService -> request | Pods | delete -> last request p50 / p99 ms | (a) delete -> slice | (b) slice -> DiscoveredService | (c) DiscoveredService -> last request | censored | requests ok / failed | per-Pod request interval ms |\n\
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            r["rollouts_per_gateway"], r["replicas"], r["grace_s"], r["coalesce_window_ms"]
        ));
        let pp = |v: &Value| format!("{} / {}", f(&v["p50"], 0), f(&v["p99"], 0));
        for g in r["gateways"].as_array().into_iter().flatten() {
            let (u, d) = (&g["ready_split_ms"], &g["delete_split_ms"]);
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |\n",
                g["gateway"].as_str().unwrap_or(""),
                g["pods_ready_measured"],
                pp(&g["ready_to_first_request_ms"]),
                pp(&u["a_pod_ready_to_endpointslice"]),
                pp(&u["b_endpointslice_to_discoveredservice"]),
                pp(&u["c_discoveredservice_to_first_request"]),
                g["pods_deleted_measured"],
                pp(&g["delete_to_last_request_ms"]),
                pp(&d["a_pod_deleted_to_endpointslice"]),
                pp(&d["b_endpointslice_to_discoveredservice"]),
                pp(&d["c_discoveredservice_to_last_request"]),
                g["deletes_censored_by_pod_removal"],
                g["requests_ok"],
                g["requests_failed"],
                f(&g["mean_request_interval_per_pod_ms"], 0),
            ));
        }
        if let Some(sk) = r["skipped"].as_object().filter(|m| !m.is_empty()) {
            for (k, v) in sk {
                out.push_str(&format!("\nSkipped {k}: {}\n", v.as_str().unwrap_or("")));
            }
        }
        out.push('\n');
    }
    for r in of("kwok-scale") {
        out.push_str(&kwok_scale(&r));
    }
    for r in of("xds") {
        out.push_str(&xds(&r));
    }
    out
}

/// The `xds` scenario: each (streams, protocol, server) run in a row.
fn xds(r: &Value) -> String {
    let mut out = format!(
        "### xDS: {} services x {} endpoints, changes at {}/s, kube-discovery against go-control-plane\n\nLatency: a change's commit (controller: the API server's write log; go-control-plane: its command written) to the first / the last stream holding the new endpoints. CPU and RSS over the change phase; client: the ADS load process.\n\n| streams | protocol | server | changes | reached every stream | p50 ms (first / last) | p99 ms (first / last) | max ms | server CPU s | server RSS max MiB | client CPU s | bytes per change per stream | one assignment B | responses per stream |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        r["services"], r["endpoints_per_service"], r["rate"]
    );
    for x in r["runs"].as_array().into_iter().flatten() {
        let (lf, ll) = (&x["latency_first_stream_ms"], &x["latency_last_stream_ms"]);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} / {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x["streams"],
            x["protocol"].as_str().unwrap_or(""),
            x["server"].as_str().unwrap_or(""),
            x["changes"],
            x["reached_every_stream"],
            f(&lf["p50"], 1),
            f(&ll["p50"], 1),
            f(&lf["p99"], 1),
            f(&ll["p99"], 1),
            f(&ll["max"], 0),
            f(&x["server_cpu_s"], 1),
            f(&x["server_rss_mib_max"], 0),
            f(&x["client_cpu_s"], 1),
            f(&x["bytes_per_change_per_stream"], 0),
            f(&x["assignment_bytes"], 0),
            f(&x["responses_per_stream"], 0),
        ));
    }
    for e in r["failures"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\nFAILED: {} {} x {}: {}\n",
            e["server"].as_str().unwrap_or(""),
            e["protocol"].as_str().unwrap_or(""),
            e["streams"],
            e["error"].as_str().unwrap_or("")
        ));
    }
    out.push('\n');
    for t in r["targets"].as_array().into_iter().flatten() {
        let mut t = t.clone();
        let head = format!(
            "{} streams, {}: ",
            t["streams"],
            t["protocol"].as_str().unwrap_or("")
        );
        if let Some(m) = t.as_object_mut() {
            m.remove("streams");
            m.remove("protocol");
        }
        out.push_str(&head);
        out.push_str(&targets(&t));
    }
    out
}

/// The `kwok-scale` run: each step's time, and CPU seconds / RSS of every process in it.
fn kwok_scale(r: &Value) -> String {
    const PROCS: [&str; 6] = [
        "kube-discovery",
        "kube-apiserver",
        "etcd",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ];
    let mut out = format!(
        "### kwok scale: {} Deployments x {} Pods ({} Pods) on {} Nodes in 3 zones\n\nEach cell: CPU s in the step / RSS MiB at its end.\n\n| step | s |",
        r["deployments"], r["replicas"], r["pods"], r["nodes"]
    );
    for p in PROCS {
        out.push_str(&format!(" {p} |"));
    }
    out.push_str("\n|---|---|");
    out.push_str(&"---|".repeat(PROCS.len()));
    out.push('\n');
    let rolling = format!(
        "{} Deployments rolling: every DiscoveredService equal again",
        r["rolling"]["deployments"]
    );
    for (step, key, time) in [
        ("create, every Pod Ready", "cluster", "all_pods_ready_s"),
        (
            "first sync: every DiscoveredService equal",
            "first_sync",
            "all_equal_s",
        ),
        (rolling.as_str(), "rolling", "all_equal_s"),
    ] {
        let s = &r[key];
        out.push_str(&format!("| {step} | {} |", f(&s[time], 1)));
        for p in PROCS {
            let u = &s["usage"][p];
            if u.is_null() {
                out.push_str(" - |");
            } else {
                out.push_str(&format!(
                    " {} / {} |",
                    f(&u["cpu_s"], 1),
                    f(&u["rss_mib"], 0)
                ));
            }
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "\nDiscoveredService writes: {} in the first sync, {} in the rolling step ({} Pods replaced; rollouts done at {} s, old Pods gone at {} s); kube-discovery peak RSS {} MiB.\n\n",
        r["first_sync"]["ds_writes"],
        r["rolling"]["ds_writes"],
        r["rolling"]["pods_replaced"],
        f(&r["rolling"]["rollouts_done_s"], 1),
        f(&r["rolling"]["old_pods_gone_s"], 1),
        f(&r["controller_peak_rss_mib"], 1),
    ));
    out
}

fn targets(t: &Value) -> String {
    let mut s = String::from("Targets: ");
    if let Some(m) = t.as_object() {
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("`{k}` {}", yes(v))).collect();
        s.push_str(&parts.join(", "));
    }
    s.push_str("\n\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_each_scenario() {
        let r = json!({"runs": [
            {"scenario": "sync", "mode": "slices", "services": 2, "endpoints_per_service": 3, "endpoints": 6, "sync_s": 1.5,
             "rss_within_budget": false, "content_check": {"ok": true}},
            {"scenario": "recovery", "mode": "slices", "idle_restart": {"api_writes": 0}, "forced_410": {}, "outage": {}, "targets_met": {"idle_restart_zero_writes": true}},
            {"scenario": "multi", "clusters": 3, "services_per_cluster": 4, "endpoints_per_service": 5, "endpoints": 60,
             "first_sync": {"sync_s": 0.5}, "idle_restart": {"ds_api_writes": 0},
             "cluster_away_and_back": {"cluster": "c2", "services_rewritten": 2, "only_the_changed_rewritten": true}, "targets_met": {}},
            {"scenario": "gateways", "replicas": 20, "rollouts_per_gateway": 10, "grace_s": 5, "coalesce_window_ms": 100,
             "skipped": {"haproxy": "haproxy is not installed"},
             "gateways": [{"gateway": "nginx", "pods_ready_measured": 200, "ready_to_first_request_ms": {"p50": 150.4, "p99": 410.0},
                           "ready_split_ms": {"a_pod_ready_to_endpointslice": {"p50": 9.0, "p99": 30.0}},
                           "requests_ok": 9000, "requests_failed": 0}]},
            {"scenario": "xds", "services": 10, "endpoints_per_service": 2, "rate": 5.0,
             "runs": [{"streams": 3, "protocol": "delta", "server": "kube-discovery", "changes": 4, "reached_every_stream": 4,
                       "latency_first_stream_ms": {"p50": 1.0, "p99": 2.0}, "latency_last_stream_ms": {"p50": 3.0, "p99": 4.0, "max": 5.0}}],
             "failures": [{"server": "go-control-plane", "protocol": "delta", "streams": 3, "error": "boom"}],
             "targets": [{"streams": 3, "protocol": "delta", "p99_le_50ms": true}]},
        ]});
        let md = markdown(&r);
        assert!(md.contains("| slices | 2 x 3 | 6 | 1.50 |"), "{md}");
        assert!(md.contains("**NO**"));
        assert!(md.contains("`idle_restart_zero_writes` yes"));
        assert!(!md.contains("### Churn"));
        assert!(
            md.contains("### Many clusters: 3 clusters x 4 services x 5 endpoints"),
            "{md}"
        );
        assert!(
            md.contains("services rewritten | 2 (only the changed: yes)"),
            "{md}"
        );
        assert!(
            md.contains("| nginx | 200 | 150 / 410 | 9 / 30 | - / - |"),
            "{md}"
        );
        assert!(
            md.contains("Skipped haproxy: haproxy is not installed"),
            "{md}"
        );
        assert!(
            md.contains("| 3 | delta | kube-discovery | 4 | 4 | 1.0 / 3.0 | 2.0 / 4.0 | 5 |"),
            "{md}"
        );
        assert!(
            md.contains("FAILED: go-control-plane delta x 3: boom"),
            "{md}"
        );
        assert!(
            md.contains("3 streams, delta: Targets: `p99_le_50ms` yes"),
            "{md}"
        );
    }
}
