//! The binary's two names and what a shell needs from it.
//!
//! One executable, three names: `kube-discovery`; `kubectl-discovery`, the
//! name krew's naming guide gives the kubectl plugin `discovery` (`kubectl
//! discovery nodes ns/name:port` runs `kubectl-discovery nodes ns/name:port`);
//! and `kubectl_complete-discovery`, which kubectl (1.26+) runs to complete
//! `kubectl discovery <TAB>`. The name it was started under (`argv[0]`) decides.
//! Completion scripts (`clap_complete`) and man pages (`clap_mangen`) are
//! generated from the same clap definition, so they cannot drift from it.

use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::Error;
use crate::cmd::cli::Cli;

/// The executable's own name.
pub const BIN: &str = "kube-discovery";
/// The executable name of the kubectl plugin `discovery` (krew naming guide).
pub const PLUGIN_BIN: &str = "kubectl-discovery";
/// How a user types the plugin.
pub const PLUGIN_USAGE: &str = "kubectl discovery";
/// The executable kubectl runs to complete the plugin's arguments.
pub const PLUGIN_COMPLETE_BIN: &str = "kubectl_complete-discovery";

/// The name the binary was started under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocation {
    /// `kube-discovery` (or any other name).
    Direct,
    /// `kubectl-discovery`, usually started by `kubectl discovery ...`.
    KubectlPlugin,
    /// `kubectl_complete-discovery`, started by kubectl's shell completion
    /// (see [`kubectl_complete`]).
    KubectlComplete,
}

impl Invocation {
    /// From `argv[0]`: its file name without directory and extension
    /// (`/usr/local/bin/kubectl-discovery`, `kubectl-discovery.exe`).
    pub fn from_argv0(argv0: Option<&OsStr>) -> Self {
        match argv0.and_then(|a| Path::new(a).file_stem()) {
            Some(s) if s == PLUGIN_BIN => Self::KubectlPlugin,
            Some(s) if s == PLUGIN_COMPLETE_BIN => Self::KubectlComplete,
            _ => Self::Direct,
        }
    }

    /// The executable name (what a completion script is registered for).
    pub fn bin(self) -> &'static str {
        match self {
            Self::Direct => BIN,
            Self::KubectlPlugin | Self::KubectlComplete => PLUGIN_BIN,
        }
    }

    /// The clap command, named as this invocation is typed: usage lines and
    /// errors of the plugin say `kubectl discovery nodes ...`.
    pub fn command(self) -> clap::Command {
        let cmd = Cli::command();
        match self {
            Self::Direct => cmd,
            Self::KubectlPlugin | Self::KubectlComplete => cmd
                .name(PLUGIN_BIN)
                .bin_name(PLUGIN_USAGE)
                .display_name(PLUGIN_BIN),
        }
    }

    /// Parses the command line (`--help`, `--version` and usage errors exit
    /// here, as clap does).
    pub fn parse(self) -> Cli {
        use clap::FromArgMatches;
        let mut cmd = self.command();
        let matches = cmd.clone().get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
    }
}

/// The completion script of `shell` for this invocation's executable name.
pub fn completion(invocation: Invocation, shell: Shell) -> Vec<u8> {
    let mut cmd = invocation.command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, invocation.bin(), &mut out);
    if shell == Shell::Bash {
        fix_bash_hyphenated_bin(&mut out, invocation.bin());
    }
    out
}

/// Cobra's shell completion directives (kubectl passes them to the shell).
const DIRECTIVE_DEFAULT: u8 = 0; // the shell may complete file names
const DIRECTIVE_NO_FILE: u8 = 4; // only the candidates given

/// What kubectl's completion asks of `kubectl_complete-discovery`: `args` are
/// the words after `kubectl discovery`, the last one the word being completed
/// (maybe empty). Prints one candidate per line (`word<TAB>description`) and
/// a last line `:<directive>`, Cobra's protocol: subcommands, flags of the
/// command reached (after `-`), and the values of a flag that has a fixed set.
pub fn kubectl_complete(args: &[String]) -> String {
    let mut root = Invocation::KubectlPlugin.command();
    root.build();
    let (current, done) = match args.split_last() {
        Some((c, d)) => (c.as_str(), d),
        None => ("", &[][..]),
    };
    let mut cmd = &root;
    let mut wants_value: Option<&clap::Arg> = None;
    for word in done {
        if wants_value.take().is_some() {
            continue;
        }
        let flag = if let Some(long) = word.strip_prefix("--") {
            (!long.contains('=')).then(|| cmd.get_arguments().find(|a| a.get_long() == Some(long)))
        } else if let Some(short) = word.strip_prefix('-').filter(|s| s.chars().count() == 1) {
            Some(cmd.get_arguments().find(|a| {
                short
                    .chars()
                    .next()
                    .is_some_and(|c| a.get_short() == Some(c))
            }))
        } else {
            if let Some(sub) = cmd.find_subcommand(word) {
                cmd = sub;
            }
            None
        };
        wants_value = flag.flatten().filter(|a| a.get_action().takes_values());
    }
    let one_line = |s: Option<&clap::builder::StyledStr>| {
        s.map(|s| {
            s.to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .replace('\t', " ")
        })
        .unwrap_or_default()
    };
    let mut candidates: Vec<(String, String)> = Vec::new();
    let directive = if let Some(arg) = wants_value {
        candidates.extend(
            arg.get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| (v.get_name().to_string(), one_line(v.get_help()))),
        );
        if candidates.is_empty() {
            DIRECTIVE_DEFAULT
        } else {
            DIRECTIVE_NO_FILE
        }
    } else if current.starts_with('-') {
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = a.get_long() {
                candidates.push((format!("--{long}"), one_line(a.get_help())));
            }
        }
        DIRECTIVE_NO_FILE
    } else if cmd.has_subcommands() {
        candidates.extend(
            cmd.get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| (c.get_name().to_string(), one_line(c.get_about()))),
        );
        DIRECTIVE_NO_FILE
    } else {
        // A positional argument (a service name, a file): the shell's default.
        DIRECTIVE_DEFAULT
    };
    let mut out = String::new();
    for (word, help) in candidates.iter().filter(|(w, _)| w.starts_with(current)) {
        out.push_str(word);
        if !help.is_empty() {
            out.push('\t');
            out.push_str(help);
        }
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    out
}

/// clap_complete (4.6.12) spells the bash state of a subcommand of a
/// hyphenated binary two ways: the loop over the words reaches
/// `kube__discovery__subcmd__nodes`, the case arms test
/// `kube__subcmd__discovery__subcmd__nodes`, so nothing after the first word
/// completes (clap-rs/clap#6421, open). The arms are rewritten to the loop's
/// spelling; once clap fixes it, there is nothing to rewrite.
fn fix_bash_hyphenated_bin(script: &mut Vec<u8>, bin: &str) {
    let broken = bin.replace('-', "__subcmd__");
    let fixed = bin.replace('-', "__");
    if broken != fixed
        && let Ok(text) = std::str::from_utf8(script)
    {
        *script = text.replace(&broken, &fixed).into_bytes();
    }
}

/// The man page of the top-level command (roff).
pub fn man_page(invocation: Invocation) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    clap_mangen::Man::new(invocation.command())
        .render(&mut out)
        .map_err(|source| Error::Write {
            path: "the man page".into(),
            source,
        })?;
    Ok(out)
}

/// Writes one man page per command (`kube-discovery.1`,
/// `kube-discovery-nodes.1`, ...) into `dir`, creating it; returns the files.
pub fn man_pages_to(invocation: Invocation, dir: &Path) -> Result<Vec<String>, Error> {
    let io = |source| Error::Write {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    clap_mangen::generate_to(invocation.command(), dir).map_err(io)?;
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map_err(io)?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".1"))
        .collect();
    files.sort();
    Ok(files)
}

/// Writes `bytes` to stdout. A reader that went away (`| head`) is not an
/// error; any other write failure is.
pub fn write_stdout(bytes: &[u8]) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Write {
            path: "stdout".into(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
