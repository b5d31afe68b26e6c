use super::*;

/// Every subcommand a user can type.
const SUBCOMMANDS: [&str; 8] = [
    "run",
    "crd",
    "render",
    "nodes",
    "demo",
    "sync",
    "completion",
    "man",
];

#[test]
fn argv0_picks_the_plugin_name_only_for_kubectl_discovery() {
    for (argv0, want) in [
        (Some("kubectl-discovery"), Invocation::KubectlPlugin),
        (
            Some("/home/u/.krew/bin/kubectl-discovery"),
            Invocation::KubectlPlugin,
        ),
        (Some("kubectl-discovery.exe"), Invocation::KubectlPlugin),
        (Some("kube-discovery"), Invocation::Direct),
        (Some("/usr/bin/kube-discovery"), Invocation::Direct),
        (Some("kubectl-discovery-old"), Invocation::Direct),
        (Some("kubectl"), Invocation::Direct),
        (
            Some("/usr/local/bin/kubectl_complete-discovery"),
            Invocation::KubectlComplete,
        ),
        (Some(""), Invocation::Direct),
        (None, Invocation::Direct),
    ] {
        assert_eq!(
            Invocation::from_argv0(argv0.map(OsStr::new)),
            want,
            "{argv0:?}"
        );
    }
}

fn usage(invocation: Invocation, args: &[&str]) -> String {
    let err = invocation
        .command()
        .try_get_matches_from(args)
        .expect_err("usage error");
    err.render().to_string()
}

#[test]
fn the_plugin_names_itself_as_kubectl_types_it() {
    let help = Invocation::KubectlPlugin
        .command()
        .render_long_help()
        .to_string();
    assert!(
        help.contains("Usage: kubectl discovery [OPTIONS] <COMMAND>"),
        "{help}"
    );
    let err = usage(Invocation::KubectlPlugin, &["kubectl-discovery", "nodes"]);
    assert!(
        err.contains("Usage: kubectl discovery nodes"),
        "a usage error names the plugin: {err}"
    );
    let err = usage(Invocation::Direct, &["kube-discovery", "nodes"]);
    assert!(err.contains("Usage: kube-discovery nodes"), "{err}");
}

fn text(b: Vec<u8>) -> String {
    String::from_utf8(b).expect("UTF-8")
}

#[test]
fn every_shell_completes_every_subcommand_under_both_names() {
    let subcommands: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for s in SUBCOMMANDS {
        assert!(subcommands.iter().any(|n| n == s), "{s}: {subcommands:?}");
    }
    for inv in [Invocation::Direct, Invocation::KubectlPlugin] {
        for shell in [
            Shell::Bash,
            Shell::Zsh,
            Shell::Fish,
            Shell::PowerShell,
            Shell::Elvish,
        ] {
            let script = text(completion(inv, shell));
            assert!(script.contains(inv.bin()), "{shell} {inv:?}");
            for s in &subcommands {
                assert!(script.contains(s.as_str()), "{shell} {inv:?} lacks {s}");
            }
        }
    }
    // clap-rs/clap#6421 worked around: one spelling of the bash states.
    for inv in [Invocation::Direct, Invocation::KubectlPlugin] {
        let bash = text(completion(inv, Shell::Bash));
        assert!(!bash.contains("__subcmd__discovery"), "{bash}");
        assert!(bash.contains("discovery__subcmd__nodes)"), "{bash}");
    }
    // Registered for the executable's name: bash's `complete` line.
    let bash = text(completion(Invocation::KubectlPlugin, Shell::Bash));
    assert!(
        bash.lines().any(|l| {
            let l = l.trim();
            l.starts_with("complete ") && l.ends_with(" kubectl-discovery")
        }),
        "{bash}"
    );
}

#[test]
fn man_page_names_the_command_and_lists_the_subcommands() {
    let page = text(man_page(Invocation::Direct).expect("man page"));
    assert!(page.contains(".TH kube-discovery 1"), "{page}");
    assert!(page.contains(".SH NAME"), "{page}");
    assert!(page.contains(".SH SYNOPSIS"), "{page}");
    assert!(page.contains("kube\\-discovery\\-nodes(1)"), "{page}");

    let dir = tempfile::tempdir().expect("temp dir");
    let files = man_pages_to(Invocation::Direct, &dir.path().join("man1")).expect("pages");
    for f in [
        "kube-discovery.1",
        "kube-discovery-nodes.1",
        "kube-discovery-sync-nginx.1",
    ] {
        assert!(files.iter().any(|x| x == f), "{f}: {files:?}");
    }
    // A directory that cannot be created is an error naming it, not a panic.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").expect("write");
    let err = man_pages_to(Invocation::Direct, &blocker.join("man1")).expect_err("not a dir");
    assert!(err.to_string().contains("file/man1"), "{err}");
}

fn complete(words: &[&str]) -> Vec<String> {
    let args: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    kubectl_complete(&args)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn kubectl_completion_follows_the_command_line() {
    let top = complete(&[""]);
    assert_eq!(top.last().map(String::as_str), Some(":4"), "{top:?}");
    for s in SUBCOMMANDS {
        assert!(
            top.iter().any(|l| l.split('\t').next() == Some(s)),
            "{s}: {top:?}"
        );
    }
    assert!(
        top.iter()
            .any(|l| l.starts_with("nodes\tPrint the nodes of")),
        "with descriptions: {top:?}"
    );
    assert_eq!(
        complete(&["re"]),
        [
            "render\tPrint the DiscoveredServices the controller would write for the given \
                 Kubernetes objects (Endpoints, EndpointSlices; one object, multi-document \
                 YAML/JSON, or a List)",
            ":4"
        ]
    );
    assert_eq!(
        complete(&["sync", "h"])[0].split('\t').next(),
        Some("haproxy")
    );
    let flags = complete(&["nodes", "--snap"]);
    let names: Vec<&str> = flags.iter().filter_map(|l| l.split('\t').next()).collect();
    assert_eq!(names, ["--snapshot", "--snapshot-dir", ":4"]);
    // Flag values: a fixed set, or the shell's file completion.
    assert_eq!(complete(&["completion", "--log-format", ""]).len(), 3);
    assert_eq!(
        complete(&["render", "-o", "j"]),
        ["json\tA JSON `List`", ":4"]
    );
    assert_eq!(complete(&["nodes", "--kubeconfig", ""]), [":0"]);
    assert_eq!(complete(&["render", "-f", ""]), [":0"]);
    // After a flag's value, the command's words again; a positional: files.
    assert_eq!(
        complete(&["--log-format", "json", "cr"]),
        [
            "crd\tPrint the DiscoveredService CustomResourceDefinition YAML",
            ":4"
        ]
    );
    assert_eq!(complete(&["nodes", ""]), [":0"]);
    // Nothing matches: no candidates, still a directive; no args at all.
    assert_eq!(complete(&["zzz"]), [":4"]);
    assert_eq!(kubectl_complete(&[]).lines().last(), Some(":4"));
}
