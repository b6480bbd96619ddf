//! The peers of `arc-rec bench bandit --peers`: Vowpal Wabbit and MABWiser policies in a Python
//! child process (`bench/peers.py`, embedded in the binary), driven round by round over JSON lines
//! as [`PeerPolicies`].

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::recommend::benchmark::{PeerChoice, PeerFeedback, PeerPolicies, PeerRound, PeerWarm};

/// The peer script, embedded so the binary runs it from anywhere.
const PEERS_SCRIPT: &str = include_str!("../../bench/peers.py");

/// `--peers` names: a family, or one configuration.
pub fn expand_peers(names: &[String]) -> anyhow::Result<Vec<String>> {
    let mut policies: Vec<String> = Vec::new();
    for name in names {
        let single = [name.as_str()];
        let expanded: &[&str] = match name.as_str() {
            "vw" => &["vw-squarecb", "vw-epsilon", "vw-regcb"],
            "mabwiser" => &["mabwiser-lints"],
            "vw-squarecb" | "vw-epsilon" | "vw-regcb" | "vw-bag" | "mabwiser-lints" => &single,
            other => bail!(
                "--peers: unknown peer {other:?}; use vw, mabwiser, or one of vw-squarecb, vw-epsilon, vw-regcb, vw-bag, mabwiser-lints"
            ),
        };
        for policy in expanded {
            if !policies.iter().any(|p| p == policy) {
                policies.push((*policy).to_owned());
            }
        }
    }
    Ok(policies)
}

/// The Python policies, one child process.
#[derive(Debug)]
pub struct PythonPeers {
    names: Vec<String>,
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    _script: tempfile::TempPath,
}

impl PythonPeers {
    /// Starts `python` on the embedded script with `policies`.
    pub fn start(python: &Path, policies: Vec<String>, seed: u64) -> anyhow::Result<Self> {
        let mut file = tempfile::Builder::new()
            .prefix("arc-rec-peers-")
            .suffix(".py")
            .tempfile()?;
        file.write_all(PEERS_SCRIPT.as_bytes())?;
        let script = file.into_temp_path();
        let mut child = Command::new(python)
            .arg(&script)
            .arg("--policies")
            .arg(policies.join(","))
            .arg("--seed")
            .arg(seed.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| {
                format!(
                    "--python {}: cannot start it (scripts/setup.sh installs .venv with vowpalwabbit and mabwiser)",
                    python.display()
                )
            })?;
        let stdin = BufWriter::new(child.stdin.take().context("no stdin")?);
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        Ok(Self {
            names: policies,
            child,
            stdin,
            stdout,
            _script: script,
        })
    }

    fn call(&mut self, message: &Value) -> Result<Value, String> {
        let fail = |what: String| format!("the peer process {what}");
        serde_json::to_writer(&mut self.stdin, message).map_err(|e| fail(e.to_string()))?;
        self.stdin
            .write_all(b"\n")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| fail(format!("stopped reading ({e})")))?;
        let mut line = String::new();
        let read = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| fail(e.to_string()))?;
        if read == 0 {
            let status = self.child.try_wait().ok().flatten();
            return Err(fail(format!(
                "ended ({}); its error is above",
                status.map_or("still running".to_owned(), |s| s.to_string())
            )));
        }
        let answer: Value =
            serde_json::from_str(&line).map_err(|e| fail(format!("answered {line:?}: {e}")))?;
        if let Some(error) = answer.get("error") {
            return Err(fail(format!("refused: {error}")));
        }
        Ok(answer)
    }
}

impl PeerPolicies for PythonPeers {
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn choose(&mut self, round: &PeerRound) -> Result<Vec<PeerChoice>, String> {
        let message = serde_json::to_value(round).map_err(|e| e.to_string())?;
        let answer = self.call(&message)?;
        self.names
            .iter()
            .map(|name| {
                let choice = &answer["choices"][name];
                let index = choice["index"]
                    .as_u64()
                    .ok_or_else(|| format!("no choice of {name} in {answer}"))?;
                let seen = answer["seen"][name]
                    .as_array()
                    .map(|keys| {
                        keys.iter()
                            .filter_map(|k| k.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(PeerChoice {
                    policy: name.clone(),
                    index: usize::try_from(index).map_err(|e| e.to_string())?,
                    seen,
                })
            })
            .collect()
    }

    fn learn(&mut self, feedback: &[PeerFeedback]) -> Result<(), String> {
        self.call(&json!({ "learn": feedback })).map(|_| ())
    }

    fn warm(&mut self, decisions: &[PeerWarm]) -> Result<(), String> {
        // In chunks, so no message grows with the log.
        for chunk in decisions.chunks(1_000) {
            self.call(&json!({ "warm": chunk }))?;
        }
        Ok(())
    }

    fn seconds(&mut self) -> Result<HashMap<String, f64>, String> {
        let answer = self.call(&json!({"stats": true}))?;
        serde_json::from_value(answer["seconds"].clone()).map_err(|e| e.to_string())
    }
}

impl Drop for PythonPeers {
    fn drop(&mut self) {
        // Closing stdin ends the script; wait so no zombie is left.
        let _ = self.stdin.flush();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The default interpreter: the project's virtualenv (where setup installs the peers' packages)
/// when run from the repository, else `python3`.
pub fn default_python() -> PathBuf {
    let venv = PathBuf::from(".venv/bin/python");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    }
}
