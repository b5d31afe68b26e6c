//! Chart values for installing, upgrading and operating the controller the way
//! users run ingress-nginx, cert-manager and external-dns, rendered with
//! `helm template` (no API server): startupProbe, topology spread, the PDB's
//! minAvailable/maxUnavailable, the monitoring objects (ServiceMonitor
//! relabelings, PodMonitor, PrometheusRule, Grafana dashboard ConfigMap), the
//! NetworkPolicy, the reader binding, `extraObjects`, `global.imageRegistry`,
//! the Artifact Hub annotations, and the schema's rejections of bad values.
//! (The alerts themselves: `chart/monitoring.rs`; on an API server:
//! `chart/upgrade.rs`, `chart/deploy_manifest.rs`.)

use crate::chart_support;

use chart_support::*;
use serde_json::{Value, json};

fn deployment(args: &[&str]) -> Value {
    find(&render("kd", "kube-discovery", args), "Deployment", None).clone()
}

#[test]
fn chart_probes_and_topology_spread_defaults() {
    let dep = deployment(&[]);
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["startupProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["startupProbe"]["httpGet"]["port"], "http");
    assert!(
        c["livenessProbe"]["initialDelaySeconds"].is_null(),
        "the startup probe replaces the liveness delay: {}",
        c["livenessProbe"]
    );
    // Two spread constraints (nodes, zones) that never block scheduling, each
    // selecting this release's pods.
    let selector = json!({"matchLabels": {
        "app.kubernetes.io/name": "kube-discovery",
        "app.kubernetes.io/instance": "kd",
    }});
    let tsc = pod["topologySpreadConstraints"]
        .as_array()
        .expect("topologySpreadConstraints");
    let keys: Vec<&str> = tsc
        .iter()
        .map(|t| t["topologyKey"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        keys,
        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    );
    for t in tsc {
        assert_eq!(t["whenUnsatisfiable"], "ScheduleAnyway", "{t}");
        assert_eq!(t["maxSkew"], 1);
        assert_eq!(t["labelSelector"], selector, "{t}");
    }
    // A constraint with its own labelSelector keeps it; null probes disable.
    let dep = deployment(&[
        "--set-json",
        r#"topologySpreadConstraints=[{"maxSkew":2,"topologyKey":"zone","whenUnsatisfiable":"DoNotSchedule","labelSelector":{"matchLabels":{"a":"b"}}}]"#,
        "--set-json",
        "startupProbe=null",
    ]);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([{"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"a": "b"}}}])
    );
    assert!(pod["containers"][0]["startupProbe"].is_null());
    let dep = deployment(&["--set-json", "topologySpreadConstraints=[]"]);
    assert!(dep["spec"]["template"]["spec"]["topologySpreadConstraints"].is_null());
}

#[test]
fn chart_pdb_min_available_or_max_unavailable() {
    let pdb = |args: &[&str]| {
        find(
            &render("kd", "kube-discovery", args),
            "PodDisruptionBudget",
            None,
        )["spec"]
            .clone()
    };
    let spec = pdb(&[]);
    assert_eq!(spec["minAvailable"], 1, "{spec}");
    assert!(spec["maxUnavailable"].is_null());
    let spec = pdb(&["--set", "podDisruptionBudget.maxUnavailable=1"]);
    assert_eq!(spec["maxUnavailable"], 1, "{spec}");
    assert!(spec["minAvailable"].is_null(), "{spec}");
    let spec = pdb(&["--set", "podDisruptionBudget.minAvailable=50%"]);
    assert_eq!(spec["minAvailable"], "50%");
    let spec = pdb(&["--set", "podDisruptionBudget.minAvailable=0"]);
    assert_eq!(spec["minAvailable"], 0, "an explicit 0 is kept");
}

#[test]
fn chart_monitoring_objects_render_as_asked() {
    let docs = render("kd", "kube-discovery", &[]);
    for kind in [
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "NetworkPolicy",
    ] {
        assert!(
            !kinds(&docs)
                .iter()
                .any(|k| k.starts_with(&format!("{kind}/"))),
            "{kind} is opt-in"
        );
    }
    assert!(
        !kinds(&docs).iter().any(|k| k.ends_with("-dashboard")),
        "the dashboard is opt-in"
    );
    let relabel = r#"[{"sourceLabels":["__meta_kubernetes_pod_node_name"],"targetLabel":"node"}]"#;
    let drop = r#"[{"sourceLabels":["__name__"],"regex":"go_.*","action":"drop"}]"#;
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "serviceMonitor.enabled=true",
            "--set-json",
            &format!("serviceMonitor.relabelings={relabel}"),
            "--set-json",
            &format!("serviceMonitor.metricRelabelings={drop}"),
            "--set",
            "podMonitor.enabled=true,podMonitor.interval=15s,podMonitor.labels.release=prom",
            "--set-json",
            &format!("podMonitor.relabelings={relabel}"),
            "--set",
            "prometheusRule.enabled=true,prometheusRule.labels.release=prom",
            "--set",
            "grafanaDashboard.enabled=true",
        ],
    );
    let sm = find(&docs, "ServiceMonitor", None);
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(
        ep["relabelings"],
        serde_json::from_str::<Value>(relabel).unwrap()
    );
    assert_eq!(
        ep["metricRelabelings"],
        serde_json::from_str::<Value>(drop).unwrap()
    );
    let pm = find(&docs, "PodMonitor", None);
    assert_eq!(pm["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "kd"
    );
    assert_eq!(
        pm["spec"]["namespaceSelector"]["matchNames"],
        json!(["kube-discovery"])
    );
    let pep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(
        (&pep["port"], &pep["path"], &pep["interval"]),
        (&json!("http"), &json!("/metrics"), &json!("15s"))
    );
    assert_eq!(
        pep["relabelings"],
        serde_json::from_str::<Value>(relabel).unwrap()
    );
    // The port the monitors name is the container's.
    let dep = find(&docs, "Deployment", None);
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"],
        "http"
    );

    let pr = find(&docs, "PrometheusRule", None);
    assert_eq!(pr["metadata"]["labels"]["release"], "prom");
    let alerts: Vec<&str> = pr["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert_eq!(
        alerts,
        [
            "KubeDiscoveryAbsent",
            "KubeDiscoveryNotReady",
            "KubeDiscoveryNoLeader",
            "KubeDiscoveryMultipleLeaders",
            "KubeDiscoveryWatchRestarts",
            "KubeDiscoveryWriteErrors",
            "KubeDiscoveryNoWrites",
        ],
        "the snapshot alert only comes with the snapshot"
    );
    for r in pr["spec"]["groups"][0]["rules"].as_array().expect("rules") {
        let expr = r["expr"].as_str().expect("expr");
        assert!(
            expr.contains(r#"namespace="kube-discovery""#),
            "{}: selects the release namespace: {expr}",
            r["alert"]
        );
        assert!(r["labels"]["severity"].is_string() && r["annotations"]["summary"].is_string());
    }

    let cm = find(&docs, "ConfigMap", Some("kd-kube-discovery-dashboard"));
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped = std::fs::read_to_string(chart_dir().join("dashboards/kube-discovery.json"))
        .expect("dashboards/kube-discovery.json");
    let data = cm["data"]["kube-discovery.json"]
        .as_str()
        .expect("dashboard data");
    assert_eq!(
        serde_json::from_str::<Value>(data).expect("dashboard JSON"),
        serde_json::from_str::<Value>(&shipped).expect("shipped JSON"),
        "the ConfigMap carries the chart's dashboard file"
    );

    // Leader alerts only with leader election; the snapshot alert with the snapshot.
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "prometheusRule.enabled=true,controller.leaderElection.enabled=false,replicaCount=1",
            "--set",
            "controller.configMapSnapshot.enabled=true,prometheusRule.snapshotStaleMinutes=30",
            "--set-json",
            r#"prometheusRule.additionalRules=[{"alert":"Mine","expr":"vector(1)"}]"#,
            "--set",
            "grafanaDashboard.enabled=true,grafanaDashboard.namespace=monitoring",
            "--set-json",
            r#"grafanaDashboard.labels={"dash":"yes"}"#,
        ],
    );
    let rules = find(&docs, "PrometheusRule", None)["spec"]["groups"][0]["rules"].clone();
    let alerts: Vec<&str> = rules
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(!alerts.contains(&"KubeDiscoveryNoLeader"), "{alerts:?}");
    assert!(
        alerts.contains(&"KubeDiscoverySnapshotStale") && alerts.contains(&"Mine"),
        "{alerts:?}"
    );
    let stale = rules
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| r["alert"] == "KubeDiscoverySnapshotStale")
        .expect("stale rule");
    assert!(
        stale["expr"].as_str().expect("expr").contains("> 1800"),
        "{stale}"
    );
    let cm = find(&docs, "ConfigMap", Some("kd-kube-discovery-dashboard"));
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["dash"], "yes");
    // Helm merges maps: the sidecar label stays unless set to null.
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
}

#[test]
fn chart_dashboard_is_a_grafana_dashboard() {
    let text = std::fs::read_to_string(chart_dir().join("dashboards/kube-discovery.json"))
        .expect("dashboard");
    let d: Value = serde_json::from_str(&text).expect("dashboard JSON");
    assert_eq!(d["uid"], "kube-discovery");
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "{}",
        d["schemaVersion"]
    );
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "namespace", "pod"]);
    let mut ids = std::collections::BTreeSet::new();
    let mut exprs = 0;
    for p in d["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate panel id {}",
            p["id"]
        );
        let g = &p["gridPos"];
        assert!(
            g["x"].as_u64().unwrap_or(99) + g["w"].as_u64().unwrap_or(99) <= 24,
            "{}: {g}",
            p["title"]
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let e = t["expr"].as_str().expect("expr");
            assert!(
                e.contains("namespace=~\"$namespace\""),
                "{}: {e}",
                p["title"]
            );
            exprs += 1;
        }
    }
    assert!(exprs >= 20, "{exprs} queries");
}

#[test]
fn chart_network_policy_opens_only_the_http_port() {
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.ingressFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
        ],
    );
    let np = find(&docs, "NetworkPolicy", None);
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"],
        "kd"
    );
    assert_eq!(
        np["spec"]["policyTypes"],
        json!(["Ingress"]),
        "egress unrestricted by default"
    );
    assert_eq!(
        np["spec"]["ingress"],
        json!([{"ports": [{"port": "http", "protocol": "TCP"}],
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}])
    );
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.egress=[{"ports":[{"port":53,"protocol":"UDP"}]},{"ports":[{"port":6443}]}]"#,
        ],
    );
    let np = find(&docs, "NetworkPolicy", None);
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(np["spec"]["egress"][1]["ports"][0]["port"], 6443);
    assert!(
        np["spec"]["ingress"][0]["from"].is_null(),
        "any source by default"
    );
}

#[test]
fn chart_reader_role_binding_and_rbac_switches() {
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set-json",
            r#"rbac.reader.subjects=[{"kind":"ServiceAccount","name":"gateway","namespace":"edge"}]"#,
        ],
    );
    let b = find(
        &docs,
        "ClusterRoleBinding",
        Some("kd-kube-discovery-reader"),
    );
    assert_eq!(b["roleRef"]["name"], "kd-kube-discovery-reader");
    assert_eq!(
        b["subjects"],
        json!([{"kind": "ServiceAccount", "name": "gateway", "namespace": "edge"}])
    );
    let view = find(&docs, "ClusterRole", Some("kd-kube-discovery-view"));
    for agg in ["view", "edit", "admin"] {
        assert_eq!(
            view["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{agg}")],
            "true"
        );
    }
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "rbac.aggregateToView=false,rbac.reader.create=false",
        ],
    );
    for name in ["kd-kube-discovery-view", "kd-kube-discovery-reader"] {
        assert!(
            !kinds(&docs).contains(&format!("ClusterRole/{name}")),
            "{name} rendered although switched off"
        );
    }
    let docs = render("kd", "kube-discovery", &["--set", "rbac.create=false"]);
    assert!(
        !kinds(&docs).iter().any(|k| k.starts_with("ClusterRole")),
        "rbac.create=false renders no RBAC: {:?}",
        kinds(&docs)
    );
}

#[test]
fn chart_extra_objects_are_rendered_with_tpl() {
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set-json",
            r#"extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"extra-map","namespace":"{{ .Release.Namespace }}"},"data":{"release":"{{ .Release.Name }}"}}]"#,
            "--set-string",
            "extraObjects[1]=apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ include \"kube-discovery.fullname\" . }}-extra\nstringData:\n  a: b\n",
        ],
    );
    let cm = find(&docs, "ConfigMap", Some("extra-map"));
    assert_eq!(cm["metadata"]["namespace"], "kube-discovery");
    assert_eq!(cm["data"]["release"], "kd");
    let sec = find(&docs, "Secret", Some("kd-kube-discovery-extra"));
    assert_eq!(sec["stringData"]["a"], "b");
}

#[test]
fn chart_global_image_registry_and_artifact_hub_images() {
    let image = |args: &[&str]| {
        deployment(args)["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .expect("image")
            .to_string()
    };
    assert_eq!(image(&[]), "ghcr.io/kube-discovery/kube-discovery:0.1.0");
    assert_eq!(
        image(&["--set", "global.imageRegistry=mirror.example.com:5000"]),
        "mirror.example.com:5000/kube-discovery/kube-discovery:0.1.0",
        "the registry host is replaced"
    );
    assert_eq!(
        image(&[
            "--set",
            "global.imageRegistry=registry.local/proxy,image.repository=kube-discovery,image.tag=dev"
        ]),
        "registry.local/proxy/kube-discovery:dev",
        "a repository without a host gets the registry prepended"
    );
    let digest = format!("sha256:{}", "a".repeat(64));
    assert_eq!(
        image(&[
            "--set",
            "global.imageRegistry=localhost:5000",
            "--set",
            &format!("image.digest={digest}")
        ]),
        format!("localhost:5000/kube-discovery/kube-discovery@{digest}")
    );

    // Artifact Hub: the listed image is what the chart deploys by default;
    // license and links are there, every change entry is well formed.
    let chart: Value = kube_discovery_core::yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml YAML");
    let ann = &chart["annotations"];
    let nested = |key: &str| -> Value {
        kube_discovery_core::yaml::from_str(
            ann[key]
                .as_str()
                .unwrap_or_else(|| panic!("annotation {key}")),
        )
        .unwrap_or_else(|e| panic!("annotation {key} is not YAML: {e}"))
    };
    let images = nested("artifacthub.io/images");
    assert_eq!(images[0]["image"], image(&[]), "{images}");
    assert_eq!(
        images[0]["platforms"],
        json!(["linux/amd64", "linux/arm64"])
    );
    assert_eq!(ann["artifacthub.io/license"], "Apache-2.0");
    let links = nested("artifacthub.io/links");
    assert!(
        links.as_array().is_some_and(|l| l
            .iter()
            .all(|l| l["url"].as_str().is_some_and(|u| u.starts_with("https://")))),
        "{links}"
    );
    let changes = nested("artifacthub.io/changes");
    for c in changes.as_array().expect("changes list") {
        assert!(
            [
                "added",
                "changed",
                "deprecated",
                "removed",
                "fixed",
                "security"
            ]
            .contains(&c["kind"].as_str().unwrap_or_default()),
            "{c}"
        );
        assert!(
            c["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{c}"
        );
    }
    let crds = nested("artifacthub.io/crds");
    assert_eq!(crds[0]["name"], "discoveredservices.kubediscovery.io");
}

/// Bad values of the new settings, and a piece of the message helm prints.
#[test]
fn chart_schema_rejects_bad_operations_values() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--set",
                "podDisruptionBudget.minAvailable=1,podDisruptionBudget.maxUnavailable=1",
            ],
            "/podDisruptionBudget",
        ),
        (
            &["--set", "podDisruptionBudget.maxUnavailable=lots"],
            "/podDisruptionBudget/maxUnavailable",
        ),
        (
            &["--set-string", "crds.enabled=yes"],
            "/crds/enabled': got string, want boolean",
        ),
        (
            &["--set", "crds.install=true"],
            "additional properties 'install' not allowed",
        ),
        (
            &["--set", "prometheusRule.noWriteMinutes=0"],
            "/prometheusRule/noWriteMinutes': minimum",
        ),
        (
            &["--set", "podMonitor.interval=often"],
            "/podMonitor/interval': 'often' does not match pattern",
        ),
        (
            &["--set", "grafanaDashboard.label=x"],
            "additional properties 'label' not allowed",
        ),
        (
            &["--set", "networkPolicy.ingress=x"],
            "additional properties 'ingress' not allowed",
        ),
        (
            &["--set", "global.imageRegistry=https://x"],
            "/global/imageRegistry': 'https://x' does not match pattern",
        ),
        (
            &["--set", "controller.leaderElection.renewDeadline=soon"],
            "/controller/leaderElection/renewDeadline': 'soon' does not match pattern",
        ),
        (
            &[
                "--set-json",
                r#"topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"zone","whenUnsatisfiable":"Maybe"}]"#,
            ],
            "/topologySpreadConstraints/0/whenUnsatisfiable': value must be one of",
        ),
        (
            &[
                "--set-json",
                r#"rbac.reader.subjects=[{"kind":"Robot","name":"r"}]"#,
            ],
            "/rbac/reader/subjects/0/kind': value must be one of",
        ),
        (
            &["--set-string", "http.authTokenSecret.create=no"],
            "/http/authTokenSecret/create': got string, want boolean",
        ),
        (
            &["--set-json", "extraObjects=[1]"],
            "/extraObjects/0': got number, want string or object",
        ),
    ];
    let mut failures = Vec::new();
    for (args, want) in cases {
        let out = run(template_cmd("kd", "kube-discovery", args));
        let t = text(&out);
        if out.status.success() {
            failures.push(format!(
                "{args:?}: accepted, expected rejection containing {want:?}"
            ));
        } else if !t.contains(want) {
            failures.push(format!("{args:?}: message lacks {want:?}:\n{t}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The good values next to them are accepted.
    for args in [
        &["--set", "podDisruptionBudget.maxUnavailable=50%"][..],
        &["--set", "podDisruptionBudget.minAvailable=2"][..],
        &["--set", "global.imageRegistry=registry.example.com/mirror"][..],
        &[
            "--set",
            "controller.leaderElection.renewDeadline=10s,controller.leaderElection.retryPeriod=2s",
        ][..],
    ] {
        let out = run(template_cmd("kd", "kube-discovery", args));
        assert!(
            out.status.success(),
            "{args:?} should be accepted:\n{}",
            text(&out)
        );
    }
}
