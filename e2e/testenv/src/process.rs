//! A control-plane child process: started with its output in a log file,
//! checked for an early death (the error carries the log's tail), stopped by
//! pid. Every child is started through `setpriv --pdeathsig KILL` (util-linux),
//! so the kernel kills it when the test thread that started it dies, even if
//! the test process is killed and no destructor runs: no process is left behind.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{Error, Result};

/// How many bytes of a log an error quotes.
const TAIL_BYTES: u64 = 4096;

/// One running child process.
pub struct Proc {
    name: String,
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, std::ffi::OsString)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Starts `bin args`, appending stdout and stderr to `log`.
    pub fn spawn(name: &str, bin: &Path, args: Vec<String>, log: &Path) -> Result<Proc> {
        Self::spawn_with_env(name, bin, args, &[], log)
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        name: &str,
        bin: &Path,
        args: Vec<String>,
        env: &[(&str, &std::ffi::OsStr)],
        log: &Path,
    ) -> Result<Proc> {
        let mut p = Proc {
            name: name.to_string(),
            bin: bin.to_path_buf(),
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_os_string()))
                .collect(),
            log: log.to_path_buf(),
            child: None,
        };
        p.start()?;
        Ok(p)
    }

    fn start(&mut self) -> Result<()> {
        if !self.bin.is_file() {
            return Err(Error::MissingBinary {
                name: self.name.clone(),
                path: self.bin.clone(),
            });
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|source| Error::File {
                what: "opening",
                path: self.log.clone(),
                source,
            })?;
        let err = out.try_clone().map_err(|source| Error::File {
            what: "duplicating the handle of",
            path: self.log.clone(),
            source,
        })?;
        let mut cmd = if Path::new("/usr/bin/setpriv").is_file() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL", "--"]).arg(&self.bin);
            c
        } else {
            Command::new(&self.bin)
        };
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().map_err(|e| {
            Error::io(
                format!("starting {} ({})", self.name, self.bin.display()),
                e,
            )
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The name the process was started under (for logs).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file its stdout and stderr go to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Errors (with the log's tail) if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Err(Error::NotRunning {
                name: self.name.clone(),
            });
        };
        let waited = child
            .try_wait()
            .map_err(|e| Error::io(format!("waiting for {}", self.name), e))?;
        if let Some(status) = waited {
            self.child = None;
            return Err(Error::Exited {
                name: self.name.clone(),
                status,
                log: self.log.clone(),
                tail: self.tail(),
            });
        }
        Ok(())
    }

    /// The last few KiB of the log.
    pub fn tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Stops the process: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if grace.is_zero() {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            #[expect(
                clippy::disallowed_methods,
                reason = "Drop cannot await: waits the grace period for the child to exit"
            )]
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the process and starts it again with the same arguments.
    pub fn restart(&mut self, grace: Duration) -> Result<()> {
        self.stop(grace);
        self.start()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

/// The last `TAIL_BYTES` bytes of a file (lossy UTF-8).
pub fn log_tail(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return format!("({} cannot be read)", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| Error::io("binding a free port", e))?;
    Ok(l.local_addr()
        .map_err(|e| Error::io("the free port's address", e))?
        .port())
}
