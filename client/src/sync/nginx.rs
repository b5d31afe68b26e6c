//! `sync nginx`: render `upstream` blocks from DiscoveredServices, validate
//! with `nginx -t`, reload only when the rendered content changed.
//!
//! The output is ONE file for the `http {}` context, included from the
//! operator's own `nginx.conf` (`include /etc/nginx/kube-discovery/upstreams.conf;`);
//! their `proxy_pass http://<upstream>;` lines never change.
//!
//! Apply cycle (on every batch of DiscoveredService changes):
//! 1. [`render`] (pure): one `upstream` per `--service`, nodes per the
//!    [`EmptyPolicy`]; an unavailable service gets a single server that is a
//!    local `return 503;` server on a unix socket (`<output>.503.sock`), since an
//!    nginx upstream cannot be empty. Once rendered, that server stays for the
//!    life of the sync: dropping it would make the reload out of 503 delete the
//!    socket while the old workers still send requests to it (502s).
//! 2. Same bytes as on disk: nothing to do (no `nginx -t`, no reload).
//! 3. Else the new text is written to a candidate file next to the output
//!    (`.<output name>.kd-candidate`, hidden so `*.conf` globs skip it) and
//!    validated BEFORE it replaces anything: the main configuration
//!    (`--nginx-conf`, or nginx's built-in path from `nginx -V`) is copied to
//!    `.kd-check.<pid>.<main name>` in its own directory (so relative paths resolve
//!    the same) with its `include` of the output pointed at the candidate
//!    (a glob `include` whose matches contain the output, such as Debian's
//!    `include /etc/nginx/conf.d/*.conf;`, becomes explicit includes of every
//!    current match in nginx's sorted order, the output's entry swapped for the
//!    candidate), and `nginx -t -c <that copy>` checks the whole configuration
//!    with the candidate in place. Accepted: the candidate is renamed over the
//!    output (atomic); rejected: the candidate is removed and the error logged,
//!    the live file never saw it. Then `nginx -s reload`.
//! 4. Fallback when the main configuration includes the output neither
//!    directly nor through one of its own glob includes (e.g. a nested
//!    include: the output included from a file that is itself included), or
//!    when such a glob cannot be expanded faithfully: atomic rename, then
//!    `nginx -t` on the live configuration and the previous file put back when
//!    rejected (a short window in which the live file is the rejected one;
//!    nginx is never reloaded with it). A warning says so; include the output
//!    from the main configuration (directly or through a glob) to avoid it.
//!
//! Node hosts and ports are checked before rendering ([`crate::policy`]), so
//! the text can only contain addresses, numbers and our own keywords.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{Error, KubeArgs, Result};
use crate::policy::{Decider, EmptyPolicy, HostRule, ServiceRef, Target, check_unique};

/// Flags of `sync nginx`.
#[derive(Debug, Clone, clap::Args)]
pub struct NginxArgs {
    /// Where to read DiscoveredServices.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// A service to render as an upstream: `[UPSTREAM=][id/]namespace/name:port`
    /// (repeatable). Default upstream name: `kd_` + the name with `_` for other characters.
    #[arg(long = "service", required = true)]
    pub services: Vec<ServiceRef>,
    /// The file to write (include it in the `http {}` context).
    #[arg(long)]
    pub output: PathBuf,
    /// The nginx binary.
    #[arg(long, default_value = "nginx")]
    pub nginx_bin: PathBuf,
    /// nginx main configuration (`nginx -c`), default: nginx's built-in path.
    #[arg(long)]
    pub nginx_conf: Option<PathBuf>,
    /// nginx prefix (`nginx -p`).
    #[arg(long)]
    pub nginx_prefix: Option<PathBuf>,
    /// When a service has no usable node or is missing: `keep` the last good set, or `503`.
    #[arg(long, value_enum, default_value_t = EmptyPolicy::Keep)]
    pub empty_policy: EmptyPolicy,
    /// Render and validate once after the initial list, reload if nginx runs, then exit.
    #[arg(long)]
    pub once: bool,
}

/// Whether `p` can be written into an nginx directive unquoted.
fn is_plain_path(p: &str) -> bool {
    !p.is_empty()
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
}

/// The unix socket of the local 503 server next to `output`.
pub fn unavailable_socket(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(".503.sock");
    PathBuf::from(s)
}

/// Renders the upstream file. `socket` is where the local 503 server listens
/// (only rendered when some target is unavailable).
pub fn render(targets: &[(ServiceRef, Target)], socket: &str) -> String {
    render_with(targets, socket, false)
}

/// [`render`], with the local 503 server also when no target is unavailable
/// (`keep_503_server`: it was rendered before, and the old workers of the
/// reload may still route to it).
pub fn render_with(
    targets: &[(ServiceRef, Target)],
    socket: &str,
    keep_503_server: bool,
) -> String {
    let mut out = String::from(
        "# Generated by kube-discovery sync nginx from DiscoveredServices; rewritten on change, do not edit.\n",
    );
    let mut any_unavailable = false;
    for (svc, target) in targets {
        let _ = writeln!(out, "\n# {}", svc.service);
        let _ = writeln!(out, "upstream {} {{", svc.upstream);
        match target {
            Target::Nodes(nodes) => {
                for n in nodes {
                    let host = if n.host.contains(':') {
                        format!("[{}]", n.host)
                    } else {
                        n.host.to_string()
                    };
                    let _ = writeln!(out, "    server {host}:{} weight={};", n.port, n.weight);
                }
            }
            Target::Unavailable => {
                any_unavailable = true;
                out.push_str("    # no usable node: answered by the local 503 server below\n");
                let _ = writeln!(out, "    server unix:{socket};");
            }
        }
        out.push_str("}\n");
    }
    if any_unavailable || keep_503_server {
        let _ = write!(
            out,
            "\nserver {{\n    listen unix:{socket};\n    access_log off;\n    return 503;\n}}\n"
        );
    }
    out
}

fn nginx_cmd(args: &NginxArgs) -> tokio::process::Command {
    nginx_cmd_with(args, args.nginx_conf.as_deref())
}

/// `nginx [-p prefix] [-c conf]`.
fn nginx_cmd_with(args: &NginxArgs, conf: Option<&Path>) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(&args.nginx_bin);
    if let Some(p) = &args.nginx_prefix {
        c.arg("-p").arg(p);
    }
    if let Some(conf) = conf {
        c.arg("-c").arg(conf);
    }
    c.kill_on_drop(true);
    c
}

/// Where a new upstream file is written and validated before it replaces
/// `output`: `.<name>.kd-candidate` in the same directory (same file system,
/// so the final rename is atomic; hidden, so `*.conf` globs skip it).
pub fn candidate_path(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    output.with_file_name(format!(".{name}.kd-candidate"))
}

/// The copy of the main configuration that `nginx -t -c` checks:
/// `.kd-check.<pid>.<name>` next to it (same directory, so relative paths
/// resolve the same; the process id keeps two syncs sharing one main config
/// apart).
pub fn check_conf_path(main: &Path) -> PathBuf {
    let name = main
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    main.with_file_name(format!(".kd-check.{}.{name}", std::process::id()))
}

/// `p` made absolute (against the current directory) and lexically normalized.
fn normalize(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Whether `a` and `b` name the same file: equal after normalization, or the
/// same file name in directories that resolve to the same place (symlinks).
fn same_path(a: &Path, b: &Path) -> bool {
    let (a, b) = (normalize(a), normalize(b));
    if a == b {
        return true;
    }
    match (a.parent(), b.parent(), a.file_name(), b.file_name()) {
        (Some(pa), Some(pb), Some(na), Some(nb)) if na == nb => {
            matches!((pa.canonicalize(), pb.canonicalize()), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
}

/// `p` as one quoted nginx word (`"` and `\` escaped, as nginx's parser
/// reads them back).
fn quote(p: &Path) -> String {
    let mut out = String::from("\"");
    for c in p.display().to_string().chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// How nginx's `glob(3)` matches (glibc, flags 0): `*`, `?` and `[...]` stay
/// within one path component and never match a leading `.`.
const NGINX_GLOB: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: true,
};

/// Whether nginx treats an `include` argument as a glob (`ngx_conf_include`).
fn is_glob(arg: &str) -> bool {
    arg.contains(['*', '?', '['])
}

/// What a glob `include` of the main configuration means for the check copy.
#[derive(Debug, PartialEq, Eq)]
enum GlobInclude {
    /// Its matches do not contain the output: left as it is.
    Other,
    /// Its matches contain the output: the replacement argument (explicit
    /// includes of every match, the output swapped for the candidate).
    Rewrite(String),
    /// It cannot be expanded the way nginx would (invalid pattern, unreadable
    /// directory, a match nginx would glob again): no check copy.
    Unsupported,
}

/// The glob `include` `pattern` (absolute) for the check copy: its current
/// matches in nginx's order (glibc sorts the full paths with `strcmp`, nginx
/// runs in the C locale), plus the output when it does not exist yet but the
/// pattern matches it; the output's entry becomes `candidate`, and the
/// candidate itself is never included as a match of its own.
fn glob_include(pattern: &Path, output: &Path, candidate: &Path) -> GlobInclude {
    let Some(pat) = pattern.to_str() else {
        return GlobInclude::Unsupported;
    };
    // The walk of the `glob` crate skips every hidden entry when it requires
    // a literal leading dot, even for a pattern such as `.*`: walk without
    // that rule, then keep what glob(3) matches.
    let walk = glob::MatchOptions {
        require_literal_leading_dot: false,
        ..NGINX_GLOB
    };
    let (Ok(paths), Ok(full)) = (glob::glob_with(pat, walk), glob::Pattern::new(pat)) else {
        return GlobInclude::Unsupported;
    };
    let Ok(mut matches) = paths.collect::<Result<Vec<PathBuf>, _>>() else {
        return GlobInclude::Unsupported;
    };
    matches.retain(|m| full.matches_path_with(m, NGINX_GLOB));
    if !matches.iter().any(|m| same_path(m, output)) {
        // A first run: the output does not exist yet but will be read by this
        // glob. Listed the way the glob will spell it: the pattern's literal
        // directories as written (`..` kept, nginx opens the path as is), then
        // the rest of the output's path.
        let absent = matches!(
            std::fs::symlink_metadata(output),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        );
        let output_norm = normalize(output);
        let matched = glob::Pattern::new(&normalize(pattern).to_string_lossy())
            .is_ok_and(|p| p.matches_path_with(&output_norm, NGINX_GLOB));
        if !(absent && matched) {
            return GlobInclude::Other;
        }
        let literal: PathBuf = pattern
            .components()
            .take_while(|c| !is_glob(&c.as_os_str().to_string_lossy()))
            .collect();
        let Ok(rest) = output_norm.strip_prefix(normalize(&literal)) else {
            return GlobInclude::Unsupported;
        };
        let spelled = literal.join(rest);
        if !same_path(&spelled, output) {
            return GlobInclude::Unsupported;
        }
        matches.push(spelled);
    }
    matches.sort_by(|a, b| {
        a.as_os_str()
            .as_encoded_bytes()
            .cmp(b.as_os_str().as_encoded_bytes())
    });
    let mut words = Vec::with_capacity(matches.len());
    for m in matches {
        let m = if same_path(&m, output) {
            // The candidate is next to the output: spelled like this match.
            match candidate.file_name() {
                Some(name) if candidate.parent() == output.parent() => m.with_file_name(name),
                _ => normalize(candidate),
            }
        } else if same_path(&m, candidate) {
            continue;
        } else {
            m
        };
        // nginx would expand a path with glob characters again, and a path
        // that is not UTF-8 cannot be written back faithfully.
        match m.to_str() {
            Some(s) if !is_glob(s) => words.push(quote(&m)),
            _ => return GlobInclude::Unsupported,
        }
    }
    GlobInclude::Rewrite(words.join("; include "))
}

/// The end (exclusive) of the quoted nginx word whose opening quote is at
/// `b[i]` (backslash escapes skipped), at most `b.len()`.
fn quoted_end(b: &[u8], mut i: usize) -> usize {
    let q = b[i];
    i += 1;
    while i < b.len() && b[i] != q {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    (i + 1).min(b.len())
}

/// The end (exclusive) of the unquoted nginx word starting at `b[i]`.
fn word_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && !b[i].is_ascii_whitespace() && !b";{}#".contains(&b[i]) {
        i += 1;
    }
    i
}

/// The main configuration `main_text` (in directory `conf_dir`) with every
/// `include` of `output` pointed at `candidate` instead, and every glob
/// `include` whose matches contain `output` replaced by explicit includes of
/// its matches (see `glob_include`); `None` when no `include` of the main
/// configuration reaches `output` (a nested include, no include) or such a
/// glob cannot be expanded faithfully. Comments and quoted strings are
/// honoured; nothing else is changed.
pub fn shadow_config(
    main_text: &str,
    conf_dir: &Path,
    output: &Path,
    candidate: &Path,
) -> Option<String> {
    let b = main_text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    // Whether the previous significant byte ends a statement or opens a block
    // (so the next word is a directive name).
    let mut at_directive = true;
    while i < b.len() {
        match b[i] {
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            c if c.is_ascii_whitespace() => i += 1,
            b';' | b'{' | b'}' => {
                at_directive = true;
                i += 1;
            }
            b'"' | b'\'' => {
                // A quoted word: skip it (it is an argument or a quoted name).
                i = quoted_end(b, i);
                at_directive = false;
            }
            _ => {
                let start = i;
                i = word_end(b, i);
                let word = &main_text[start..i];
                if at_directive && word == "include" {
                    while i < b.len() && b[i].is_ascii_whitespace() {
                        i += 1;
                    }
                    let (arg_start, arg_end, arg) =
                        if i < b.len() && (b[i] == b'"' || b[i] == b'\'') {
                            let s = i;
                            i = quoted_end(b, i);
                            (s, i, main_text.get(s + 1..i - 1).unwrap_or_default())
                        } else {
                            let s = i;
                            i = word_end(b, i);
                            (s, i, &main_text[s..i])
                        };
                    let target = Path::new(arg);
                    let target = if target.is_absolute() {
                        target.to_path_buf()
                    } else {
                        conf_dir.join(target)
                    };
                    if !arg.is_empty() && is_glob(arg) {
                        let pattern = std::path::absolute(&target).unwrap_or(target);
                        match glob_include(&pattern, output, candidate) {
                            GlobInclude::Other => {}
                            GlobInclude::Rewrite(r) => spans.push((arg_start, arg_end, r)),
                            GlobInclude::Unsupported => return None,
                        }
                    } else if !arg.is_empty() && same_path(&target, output) {
                        spans.push((arg_start, arg_end, quote(&normalize(candidate))));
                    }
                }
                at_directive = false;
            }
        }
    }
    if spans.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(main_text.len() + 64);
    let mut last = 0;
    for (s, e, replacement) in spans {
        out.push_str(&main_text[last..s]);
        out.push_str(&replacement);
        last = e;
    }
    out.push_str(&main_text[last..]);
    Some(out)
}

/// The main configuration nginx uses: `--nginx-conf` (relative: against
/// `--nginx-prefix`, as nginx does), else the `--conf-path` nginx was built
/// with (`nginx -V`).
async fn main_conf(args: &NginxArgs) -> Option<PathBuf> {
    let p = match &args.nginx_conf {
        Some(p) => p.clone(),
        None => {
            let mut v = nginx_cmd_with(args, None);
            v.arg("-V");
            let out = v.output().await.ok()?;
            let text = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            let p = text
                .split_whitespace()
                .find_map(|w| w.strip_prefix("--conf-path="))?;
            PathBuf::from(p)
        }
    };
    if p.is_absolute() {
        Some(p)
    } else {
        args.nginx_prefix.as_ref().map(|pre| pre.join(p))
    }
}

async fn run_checked(mut c: tokio::process::Command, what: &str) -> Result<()> {
    let out = c.output().await.map_err(|source| Error::Spawn {
        program: what.to_string(),
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Failed {
            program: what.to_string(),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Writes `text` to `path` atomically (temp file in the same directory + rename).
pub async fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".kd-tmp");
    let tmp = PathBuf::from(tmp);
    write_file(&tmp, text).await?;
    place(&tmp, path).await
}

/// Writes `text` to `path` (not atomically).
async fn write_file(path: &Path, text: &str) -> Result<()> {
    tokio::fs::write(path, text)
        .await
        .map_err(|source| Error::File {
            action: "write",
            path: path.to_path_buf(),
            source,
        })
}

/// What [`apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Same content as on disk: nothing done.
    Unchanged,
    /// Written, validated and nginx reloaded.
    Reloaded,
    /// Written and validated; the reload failed (nginx not running?).
    WrittenNotReloaded,
}

/// Writes `text` if it differs from the file, validated by nginx before it
/// replaces the output (see the module docs; fallback: validated in place and
/// restored when rejected), and reloads nginx.
pub async fn apply(args: &NginxArgs, text: &str) -> Result<Applied> {
    let old = match tokio::fs::read_to_string(&args.output).await {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(Error::File {
                action: "read",
                path: args.output.clone(),
                source,
            });
        }
    };
    if old.as_deref() == Some(text) {
        return Ok(Applied::Unchanged);
    }
    let candidate = candidate_path(&args.output);
    let rejected = |e: Error| Error::Rejected {
        output: args.output.clone(),
        source: Box::new(e),
    };
    // The main configuration with its include of the output pointed at the candidate.
    let shadow = match main_conf(args).await {
        Some(main) => match tokio::fs::read_to_string(&main).await {
            Ok(main_text) => {
                let dir = main.parent().unwrap_or(Path::new("/"));
                shadow_config(&main_text, dir, &args.output, &candidate)
                    .map(|t| (check_conf_path(&main), t))
            }
            Err(e) => {
                tracing::warn!(error = %e, file = %main.display(), "cannot read the nginx main configuration");
                None
            }
        },
        None => None,
    };
    write_file(&candidate, text).await?;
    let Some((check_conf, check_text)) = shadow else {
        tracing::warn!(
            output = %args.output.display(),
            "the nginx main configuration includes the output neither directly nor through a glob of its own: validating in place (the previous file is put back when nginx rejects the new one)"
        );
        return apply_in_place(args, &candidate, old).await;
    };
    let checked = async {
        write_file(&check_conf, &check_text).await?;
        let mut test = nginx_cmd_with(args, Some(&check_conf));
        test.arg("-t").arg("-q");
        run_checked(test, "nginx -t").await
    }
    .await;
    let _ = tokio::fs::remove_file(&check_conf).await;
    if let Err(e) = checked {
        let _ = tokio::fs::remove_file(&candidate).await;
        return Err(rejected(e));
    }
    place(&candidate, &args.output).await?;
    reload(args).await
}

/// Renames the checked `candidate` over the live `output` (atomic on one filesystem).
async fn place(candidate: &Path, output: &Path) -> Result<()> {
    tokio::fs::rename(candidate, output)
        .await
        .map_err(|source| Error::Rename {
            from: candidate.to_path_buf(),
            to: output.to_path_buf(),
            source,
        })
}

/// The fallback of [`apply`]: `candidate` renamed over the output, `nginx -t`
/// on the live configuration, the previous file put back when rejected.
async fn apply_in_place(
    args: &NginxArgs,
    candidate: &Path,
    old: Option<String>,
) -> Result<Applied> {
    place(candidate, &args.output).await?;
    let mut test = nginx_cmd(args);
    test.arg("-t").arg("-q");
    if let Err(e) = run_checked(test, "nginx -t").await {
        let restored = match &old {
            Some(prev) => write_atomic(&args.output, prev).await,
            None => tokio::fs::remove_file(&args.output)
                .await
                .map_err(|source| Error::File {
                    action: "remove",
                    path: args.output.clone(),
                    source,
                }),
        };
        if let Err(r) = restored {
            tracing::error!(error = %r, file = %args.output.display(), "cannot restore the previous upstream file");
        }
        return Err(Error::Rejected {
            output: args.output.clone(),
            source: Box::new(e),
        });
    }
    reload(args).await
}

async fn reload(args: &NginxArgs) -> Result<Applied> {
    let mut reload = nginx_cmd(args);
    reload.args(["-s", "reload"]);
    match run_checked(reload, "nginx -s reload").await {
        Ok(()) => Ok(Applied::Reloaded),
        Err(e) => {
            tracing::warn!(error = %e, "upstream file written and valid, but nginx was not reloaded");
            Ok(Applied::WrittenNotReloaded)
        }
    }
}

/// Runs `sync nginx` until the watch stops (or once with `--once`).
pub async fn run_nginx(args: NginxArgs) -> Result<()> {
    check_unique(&args.services)?;
    let socket = unavailable_socket(&args.output);
    let socket = socket
        .to_str()
        .filter(|s| is_plain_path(s))
        .ok_or_else(|| Error::OutputPath(args.output.clone()))?
        .to_string();
    let mut watch = args.kube.resolver().await?;
    let mut decider = Decider::default();
    // Whether the live file has the local 503 server (this sync, or the
    // previous one, rendered it): it then stays (module doc).
    let mut served_503 = std::fs::read_to_string(&args.output)
        .is_ok_and(|t| t.contains(&format!("listen unix:{socket};")));
    tracing::info!(services = args.services.len(), output = %args.output.display(), policy = %args.empty_policy, "sync nginx started");
    'changes: loop {
        watch
            .changed_within(args.once.then_some(std::time::Duration::from_secs(30)))
            .await?;
        let mut targets = Vec::with_capacity(args.services.len());
        for svc in &args.services {
            let nodes = match watch.nodes(&svc.service) {
                // A big service's shards mid-rewrite and no earlier answer:
                // nothing is written this round; shard 0's write signals
                // the next change.
                Err(e @ crate::Error::Incomplete { .. }) => {
                    tracing::info!(error = %e, "waiting for the next change");
                    continue 'changes;
                }
                other => other?,
            };
            targets.push((
                svc.clone(),
                decider.target(svc, nodes, HostRule::IpOrDns, args.empty_policy),
            ));
        }
        let text = render_with(&targets, &socket, served_503);
        let result = apply(&args, &text).await;
        if result.is_ok() {
            served_503 |= targets
                .iter()
                .any(|(_, t)| matches!(t, Target::Unavailable));
        }
        match &result {
            Ok(Applied::Unchanged) => tracing::debug!("upstreams unchanged"),
            Ok(a) => {
                tracing::info!(applied = ?a, upstreams = %summary(&targets), "upstreams applied")
            }
            Err(e) => tracing::error!(error = format!("{e:#}"), "upstreams not applied"),
        }
        if args.once {
            return result.map(|_| ());
        }
    }
}

/// `upstream=n,upstream=503` for logs.
pub fn summary(targets: &[(ServiceRef, Target)]) -> String {
    targets
        .iter()
        .map(|(s, t)| match t {
            Target::Nodes(n) => format!("{}={}", s.upstream, n.len()),
            Target::Unavailable => format!("{}=503", s.upstream),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_discovery_core::Node;

    fn svc(s: &str) -> ServiceRef {
        s.parse().expect("service ref")
    }

    #[test]
    fn a_503_server_once_rendered_stays_when_the_service_has_nodes_again() {
        // The reload out of 503 must not delete the socket the old workers
        // still send requests to (they answered 502 until they exited).
        let t = vec![(
            svc("web=default/web:http"),
            Target::Nodes(vec![Node::new("10.0.0.1", 8080, 1)]),
        )];
        let text = render_with(&t, "/run/kd/up.conf.503.sock", true);
        assert!(
            text.contains("upstream web {\n    server 10.0.0.1:8080 weight=1;\n}\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "listen unix:/run/kd/up.conf.503.sock;\n    access_log off;\n    return 503;"
            ),
            "{text}"
        );
        assert!(!text.contains("server unix:"), "{text}");
        assert_eq!(render(&t, "/s"), render_with(&t, "/s", false));
    }

    #[test]
    fn renders_upstreams_with_weights_and_ipv6() {
        let t = vec![(
            svc("web=default/web:http"),
            Target::Nodes(vec![
                Node::new("10.0.0.1", 8080, 50),
                Node::new("fd00::2", 8080, 150),
            ]),
        )];
        let text = render(&t, "/run/kd/up.conf.503.sock");
        assert!(text.contains("upstream web {\n    server 10.0.0.1:8080 weight=50;\n    server [fd00::2]:8080 weight=150;\n}\n"), "{text}");
        assert!(
            !text.contains("return 503"),
            "no 503 server without an unavailable upstream: {text}"
        );
    }

    #[test]
    fn unavailable_service_points_at_a_local_503_server() {
        let t = vec![
            (svc("default/a:http"), Target::Unavailable),
            (svc("default/b:http"), Target::Unavailable),
            (
                svc("default/c:http"),
                Target::Nodes(vec![Node::new("10.0.0.1", 80, 1)]),
            ),
        ];
        let text = render(&t, "/tmp/x.503.sock");
        assert_eq!(
            text.matches("server unix:/tmp/x.503.sock;").count(),
            2,
            "{text}"
        );
        assert_eq!(
            text.matches("listen unix:/tmp/x.503.sock;").count(),
            1,
            "{text}"
        );
        assert!(text.contains("return 503;"));
        assert!(text.contains("upstream kd_default_c_http {"));
    }

    #[test]
    fn rendering_is_deterministic() {
        let t = vec![(
            svc("default/web:http"),
            Target::Nodes(vec![Node::new("10.0.0.1", 80, 1)]),
        )];
        assert_eq!(render(&t, "/s"), render(&t, "/s"));
    }

    #[test]
    fn shadow_config_points_the_include_of_the_output_at_the_candidate() {
        let out = Path::new("/etc/nginx/kd/upstreams.conf");
        let cand = candidate_path(out);
        assert_eq!(
            cand,
            PathBuf::from("/etc/nginx/kd/.upstreams.conf.kd-candidate")
        );
        let main = "events {}\n# include /etc/nginx/kd/upstreams.conf;\nhttp {\n  include mime.types;\n  include /etc/nginx/kd/upstreams.conf;\n  log_format x 'include /etc/nginx/kd/upstreams.conf;';\n  server { include \"kd/upstreams.conf\"; }\n}\n";
        let shadow = shadow_config(main, Path::new("/etc/nginx"), out, &cand).expect("included");
        let want = "events {}\n# include /etc/nginx/kd/upstreams.conf;\nhttp {\n  include mime.types;\n  include \"/etc/nginx/kd/.upstreams.conf.kd-candidate\";\n  log_format x 'include /etc/nginx/kd/upstreams.conf;';\n  server { include \"/etc/nginx/kd/.upstreams.conf.kd-candidate\"; }\n}\n";
        assert_eq!(shadow, want);
        // Relative with `..`, and a path that only resolves after normalization.
        let main = "http { include ./kd/../kd/upstreams.conf; }";
        assert!(shadow_config(main, Path::new("/etc/nginx"), out, &cand).is_some());
        // Not included: another file, only in a comment or a string (globs: below).
        for main in [
            "http { include /etc/nginx/kd/other.conf; }",
            "http { # include /etc/nginx/kd/upstreams.conf;\n}",
            "http { log_format x 'include /etc/nginx/kd/upstreams.conf;'; }",
            "http { proxy_pass include; }",
        ] {
            assert_eq!(
                shadow_config(main, Path::new("/etc/nginx"), out, &cand),
                None,
                "{main}"
            );
        }
    }

    /// A Debian-like layout in a temp dir: `<d>/conf.d/` with `files` (empty).
    fn conf_d(files: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path().canonicalize().expect("canonical tempdir");
        std::fs::create_dir(d.join("conf.d")).expect("conf.d");
        for f in files {
            std::fs::write(d.join("conf.d").join(f), "").expect("file");
        }
        (tmp, d)
    }

    /// `include "<d>/conf.d/<n>"` joined the way the rewrite joins them.
    fn includes(d: &Path, names: &[&str]) -> String {
        names
            .iter()
            .map(|n| format!("\"{}/conf.d/{n}\"", d.display()))
            .collect::<Vec<_>>()
            .join("; include ")
    }

    #[test]
    fn glob_include_becomes_every_match_in_nginx_order_with_the_output_swapped() {
        let (_tmp, d) = conf_d(&[
            "b.conf",
            "upstreams.conf",
            "a.conf",
            "A.conf",
            "a-b.conf",
            "a_b.conf",
            "z.conf",
            "notes.txt",
            ".hidden.conf",
            ".upstreams.conf.kd-candidate",
        ]);
        let out = d.join("conf.d/upstreams.conf");
        let cand = candidate_path(&out);
        let main = "events {}\nhttp {\n  include mime.types;\n  include conf.d/*.conf; # Debian\n  server {}\n}\n";
        let shadow = shadow_config(main, &d, &out, &cand).expect("reached through the glob");
        // strcmp order (C locale: `A` < `a`, `-` < `.` < `_`), hidden files
        // not matched, the output's entry is the candidate, one line as before.
        let want = format!(
            "events {{}}\nhttp {{\n  include mime.types;\n  include {}; # Debian\n  server {{}}\n}}\n",
            includes(
                &d,
                &[
                    "A.conf",
                    "a-b.conf",
                    "a.conf",
                    "a_b.conf",
                    "b.conf",
                    ".upstreams.conf.kd-candidate",
                    "z.conf"
                ]
            )
        );
        assert_eq!(shadow, want);
        // Absolute and quoted patterns too; a glob that does not reach the
        // output is left exactly as written.
        let main = format!(
            "http {{ include \"{d}/conf.d/[a-z]*.conf\"; include {d}/conf.d/*.txt; }}",
            d = d.display()
        );
        let shadow = shadow_config(&main, Path::new("/elsewhere"), &out, &cand).expect("glob");
        assert_eq!(
            shadow,
            format!(
                "http {{ include {}; include {}/conf.d/*.txt; }}",
                includes(
                    &d,
                    &[
                        "a-b.conf",
                        "a.conf",
                        "a_b.conf",
                        "b.conf",
                        ".upstreams.conf.kd-candidate",
                        "z.conf"
                    ]
                ),
                d.display()
            )
        );
    }

    #[test]
    fn glob_include_keeps_the_spelling_of_the_pattern() {
        // nginx opens `sub/../conf.d/x.conf` as written (`..` after a
        // symlink is not lexical), so the matches keep the pattern's spelling,
        // the candidate included.
        let (_tmp, d) = conf_d(&["b.conf", "upstreams.conf", "a.conf"]);
        std::fs::create_dir(d.join("sub")).expect("sub");
        let out = d.join("conf.d/upstreams.conf");
        let cand = candidate_path(&out);
        let shadow = shadow_config("include sub/../conf.d/*.conf;", &d, &out, &cand)
            .expect("reached through the glob");
        let s = format!("\"{}/sub/../conf.d", d.display());
        assert_eq!(
            shadow,
            format!(
                "include {s}/a.conf\"; include {s}/b.conf\"; include {s}/.upstreams.conf.kd-candidate\";"
            )
        );
    }

    #[test]
    fn glob_include_reaches_an_output_that_does_not_exist_yet() {
        let (_tmp, d) = conf_d(&["a.conf", "z.conf"]);
        let out = d.join("conf.d/upstreams.conf");
        let cand = candidate_path(&out);
        let shadow = shadow_config("http { include conf.d/*.conf; }", &d, &out, &cand)
            .expect("first run: the glob will read the output");
        assert_eq!(
            shadow,
            format!(
                "http {{ include {}; }}",
                includes(&d, &["a.conf", ".upstreams.conf.kd-candidate", "z.conf"])
            )
        );
    }

    #[test]
    fn glob_include_never_lists_the_candidate_as_a_match_of_its_own() {
        // A hidden output: `.*up.conf*` matches both it and a stale candidate
        // next to it (and a hidden entry is matched by a leading `.` only).
        let (_tmp, d) = conf_d(&[
            ".a.conf",
            ".up.conf",
            "..up.conf.kd-candidate",
            ".zup.conf",
            "up.conf",
        ]);
        let out = d.join("conf.d/.up.conf");
        let cand = candidate_path(&out);
        assert_eq!(cand, d.join("conf.d/..up.conf.kd-candidate"));
        let shadow = shadow_config("include conf.d/.*up.conf*;", &d, &out, &cand).expect("glob");
        assert_eq!(
            shadow,
            format!(
                "include {};",
                includes(&d, &["..up.conf.kd-candidate", ".zup.conf"])
            )
        );
    }

    #[test]
    fn glob_include_without_the_output_or_not_expandable_falls_back() {
        let (_tmp, d) = conf_d(&["a.conf", "upstreams.conf"]);
        let out = d.join("conf.d/upstreams.conf");
        let cand = candidate_path(&out);
        for main in [
            // No match is the output: no check copy (the in-place fallback).
            "http { include conf.d/*.txt; }",
            "http { include other/*.conf; }",
            "http { include conf.d/a*.conf; }",
            // A nested include (conf.d/a.conf could include the output).
            "http { include conf.d/a.conf; }",
        ] {
            assert_eq!(shadow_config(main, &d, &out, &cand), None, "{main}");
        }
        // A match that nginx would expand again as a glob: not rewritten.
        std::fs::write(d.join("conf.d/we[ir]d.conf"), "").expect("file");
        assert_eq!(
            shadow_config("http { include conf.d/*.conf; }", &d, &out, &cand),
            None
        );
        // An invalid pattern.
        assert_eq!(
            shadow_config("http { include conf.d/[.conf; }", &d, &out, &cand),
            None
        );
    }

    #[test]
    fn check_conf_is_next_to_the_main_config() {
        assert_eq!(
            check_conf_path(Path::new("/etc/nginx/nginx.conf")),
            PathBuf::from(format!(
                "/etc/nginx/.kd-check.{}.nginx.conf",
                std::process::id()
            ))
        );
    }

    #[test]
    fn socket_path_is_next_to_output_and_checked() {
        assert_eq!(
            unavailable_socket(Path::new("/etc/nginx/kd.conf")),
            PathBuf::from("/etc/nginx/kd.conf.503.sock")
        );
        assert!(is_plain_path("/etc/nginx/kd.conf.503.sock"));
        assert!(!is_plain_path("/tmp/a b;c"));
    }
}
