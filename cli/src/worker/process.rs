//! The other side of `shardport worker`: a child process started with piped
//! stdin/stdout, sent [`Request`]s and read [`Reply`]s one JSON line each.

use std::io::{self, BufRead, Write};

use super::{Reply, Request};

/// A `shardport worker` child process and its pipes.
#[derive(Debug)]
pub struct WorkerProcess {
    role: String,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: io::BufReader<std::process::ChildStdout>,
}

/// Errors talking to a worker process.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The process could not be started.
    #[error("cannot start the {role} process ({exe}): {source}")]
    Spawn {
        /// Role in messages (`owner`, `consumer`).
        role: String,
        /// Executable.
        exe: String,
        /// OS error.
        source: io::Error,
    },
    /// The process closed its pipes or exited.
    #[error("the {role} process exited before answering ({status}); its error is above")]
    Exited {
        /// Role.
        role: String,
        /// Exit status text.
        status: String,
    },
    /// Pipe I/O failed.
    #[error("talking to the {role} process: {source}")]
    Io {
        /// Role.
        role: String,
        /// OS error.
        source: io::Error,
    },
    /// The reply was not valid JSON.
    #[error("the {role} process sent an invalid reply `{line}`: {source}")]
    BadReply {
        /// Role.
        role: String,
        /// The line.
        line: String,
        /// Parse error.
        source: serde_json::Error,
    },
    /// The worker answered with an error.
    #[error("{role}: {message}")]
    Failed {
        /// Role.
        role: String,
        /// The worker's error text.
        message: String,
    },
}

impl WorkerProcess {
    /// Starts `exe worker <args>` with piped stdin/stdout (stderr inherited).
    pub fn spawn(
        role: &str,
        exe: &std::path::Path,
        args: &[std::ffi::OsString],
    ) -> Result<WorkerProcess, WorkerError> {
        Self::spawn_with_env(role, exe, args, &[])
    }

    /// [`spawn`](Self::spawn) with these environment variables set in the child.
    pub fn spawn_with_env(
        role: &str,
        exe: &std::path::Path,
        args: &[std::ffi::OsString],
        env: &[(String, String)],
    ) -> Result<WorkerProcess, WorkerError> {
        let mut command = std::process::Command::new(exe);
        command
            .arg("worker")
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)));
        Self::spawn_command(role, command)
    }

    /// Starts `command` (which runs `shardport worker ...`, possibly through
    /// a wrapper such as `ip netns exec`) with piped stdin/stdout.
    pub fn spawn_command(
        role: &str,
        mut command: std::process::Command,
    ) -> Result<WorkerProcess, WorkerError> {
        let shown = command.get_program().to_string_lossy().into_owned();
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|source| WorkerError::Spawn {
                role: role.to_owned(),
                exe: shown,
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = io::BufReader::new(child.stdout.take().expect("stdout is piped"));
        Ok(WorkerProcess {
            role: role.to_owned(),
            child,
            stdin,
            stdout,
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User + system CPU seconds the child has used so far (fields 14 and
    /// 15 of `/proc/<pid>/stat`); 0 where the file cannot be read or parsed.
    pub fn cpu_seconds(&self) -> f64 {
        let read = || -> Option<f64> {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
            // The command name may hold spaces and parentheses: fields are
            // counted after its closing one.
            let rest = &stat[stat.rfind(')')? + 1..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / rustix::param::clock_ticks_per_second() as f64)
        };
        read().unwrap_or(0.0)
    }

    /// Sends one request and reads its reply; a reply with `ok: false` is an error.
    pub fn call(&mut self, req: &Request) -> Result<Reply, WorkerError> {
        let reply = self.call_raw(req)?;
        if reply.ok {
            Ok(reply)
        } else {
            Err(WorkerError::Failed {
                role: self.role.clone(),
                message: reply.error.unwrap_or_default(),
            })
        }
    }

    /// Sends one request and returns the reply whatever its `ok`.
    pub fn call_raw(&mut self, req: &Request) -> Result<Reply, WorkerError> {
        let io_err = |role: &str, source| WorkerError::Io {
            role: role.to_owned(),
            source,
        };
        let mut line = serde_json::to_string(req).expect("requests serialize");
        line.push('\n');
        let sent = match self.stdin.as_mut() {
            Some(stdin) => stdin
                .write_all(line.as_bytes())
                .and_then(|()| stdin.flush()),
            None => Err(io::Error::from(io::ErrorKind::BrokenPipe)),
        };
        if let Err(e) = sent {
            return Err(if e.kind() == io::ErrorKind::BrokenPipe {
                self.exited()
            } else {
                io_err(&self.role, e)
            });
        }
        let mut answer = String::new();
        let n = self
            .stdout
            .read_line(&mut answer)
            .map_err(|e| io_err(&self.role, e))?;
        if n == 0 {
            return Err(self.exited());
        }
        serde_json::from_str(&answer).map_err(|source| WorkerError::BadReply {
            role: self.role.clone(),
            line: answer.trim_end().to_owned(),
            source,
        })
    }

    fn exited(&mut self) -> WorkerError {
        let status = match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("status unknown: {e}"),
        };
        WorkerError::Exited {
            role: self.role.clone(),
            status,
        }
    }

    /// Asks the worker to exit and waits for it.
    pub fn exit(mut self) -> Result<std::process::ExitStatus, WorkerError> {
        let _ = self.call_raw(&Request::Exit);
        self.stdin.take();
        self.child.wait().map_err(|source| WorkerError::Io {
            role: self.role.clone(),
            source,
        })
    }

    /// Kills the worker with SIGKILL (tests of peer death).
    pub fn kill(mut self) -> io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(|_| ())
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // Closing stdin ends `serve`; a worker that is still alive after that
        // is reaped so no zombie outlives us.
        self.stdin.take();
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.wait();
        }
    }
}
