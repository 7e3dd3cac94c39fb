//! The terminal chat through a real pseudo-terminal, as a user at a keyboard drives it: the line
//! editor's prompt, keys typed while an answer streams (not echoed into it), Ctrl-C sent as the
//! byte a keyboard sends (the terminal turns it into SIGINT), Ctrl-D, and the history file kept
//! between runs (Up recalls the last session's line), or not with `--no-history`.
#![cfg(target_os = "linux")]

mod common;

use common::{binary_dir, fullvocab_model};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child process on the slave side of a new pseudo-terminal (its controlling terminal), and
/// everything it has written, read from the master side by a thread.
struct Pty {
    master: std::fs::File,
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    fn spawn(args: &[&str], home: &Path) -> Pty {
        Pty::spawn_with(args, home, None)
    }

    /// With `stdin: Some(text)` the child reads `text` from a pipe (a piped chat) while the
    /// terminal stays its controlling terminal and its stdout and stderr.
    fn spawn_with(args: &[&str], home: &Path, stdin: Option<&str>) -> Pty {
        // SAFETY: posix_openpt/grantpt/unlockpt/ptsname are called on the descriptor just
        // opened (checked), and ptsname's static buffer is copied at once, before any other call.
        let (master, slave_path) = unsafe {
            let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
            assert!(fd >= 0, "posix_openpt");
            assert_eq!(libc::grantpt(fd), 0);
            assert_eq!(libc::unlockpt(fd), 0);
            let name = libc::ptsname(fd);
            assert!(!name.is_null());
            let path = std::ffi::CStr::from_ptr(name).to_str().unwrap().to_string();
            (std::fs::File::from(OwnedFd::from_raw_fd(fd)), path)
        };
        // 24 rows of 80 columns, as a terminal window has (the line editor asks).
        let size = libc::winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a `winsize` through the pointer, on our master descriptor.
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&slave_path)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen3"));
        cmd.args(args)
            .env("HOME", home)
            .env_remove("XDG_DATA_HOME")
            .env_remove("NO_COLOR")
            .env("TERM", "xterm")
            .stdin(match stdin {
                Some(_) => Stdio::piped(),
                None => Stdio::from(slave.try_clone().unwrap()),
            })
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: between fork and exec only async-signal-safe calls: setsid makes the child a
        // session leader, and TIOCSCTTY on its stderr (the slave) makes that its controlling
        // terminal, so the terminal's Ctrl-C reaches it as SIGINT.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(2, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            let text = text.to_string();
            // A thread: the chat reads its message while this test goes on.
            std::thread::spawn(move || {
                let _ = pipe.write_all(text.as_bytes());
            });
        }
        let out = Arc::new(Mutex::new(Vec::new()));
        let (mut reader, sink) = (master.try_clone().unwrap(), out.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once the child has exited and the slave is closed.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty { master, child, out }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Waits (up to 60 s) until the output after byte `from` contains `what`; returns where
    /// that occurrence ends.
    fn wait_for(&self, what: &str, from: usize) -> usize {
        let start = Instant::now();
        loop {
            let out = self.output();
            if let Some(at) = out.get(from..).and_then(|s| s.find(what)) {
                return from + at + what.len();
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no {what:?} after byte {from} in:\n{out}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn keys(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).unwrap();
        self.master.flush().unwrap();
    }

    fn wait_exit(mut self) -> (std::process::ExitStatus, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return (status, self.output());
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no exit:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn typing_during_an_answer_stays_out_of_it_and_ctrl_c_stops_it() {
    let home = binary_dir().join("home-keys");
    std::fs::create_dir_all(&home).unwrap();
    let mut t = Pty::spawn(
        &[
            "chat",
            fullvocab_model(),
            "-t",
            "0",
            "-n",
            "-1",
            "-c",
            "4096",
            "--thinking",
            "off",
        ],
        &home,
    );
    let prompt = t.wait_for(">>> ", 0);
    t.keys("Tell me a long story\r");
    // The answer has begun once its first bytes follow the echoed line.
    let line = t.wait_for("Tell me a long story", prompt);
    let start = Instant::now();
    while t.output().len() < line + 40 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no answer:\n{}",
            t.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t.keys("zqxjv");
    std::thread::sleep(Duration::from_millis(300));
    t.keys("\x03"); // Ctrl-C, as the keyboard sends it
    let end = t.wait_for("[interrupted", line);
    let answer = t.output()[line..end].to_string();
    assert!(
        !answer.contains("zqxjv"),
        "typed keys were echoed into the answer:\n{answer}"
    );
    // Back at the prompt, the keys typed during the answer were dropped, not kept for it; and
    // the dropped answer is not counted as one.
    let prompt = t.wait_for(">>> ", end);
    t.keys("/stats\r");
    let stats = t.wait_for("tokens generated", prompt);
    assert!(
        t.output()[..stats].ends_with("0 answers, tokens generated"),
        "{}",
        t.output()
    );
    t.wait_for(">>> ", stats);
    t.keys("\x04"); // Ctrl-D leaves
    let (status, out) = t.wait_exit();
    assert!(status.success(), "{out}");
    assert!(!out[prompt..].contains("zqxjv"), "{out}");
    // The line went to the history file.
    let history = home.join(".local/share/qwen3/chat_history");
    let saved = std::fs::read_to_string(&history).unwrap();
    assert!(saved.contains("Tell me a long story"), "{saved}");
}

/// `exit` alone at the terminal leaves the chat (as in a shell), without sending it.
#[test]
fn exit_at_the_terminal_leaves() {
    let home = binary_dir().join("home-exit");
    std::fs::create_dir_all(&home).unwrap();
    let args = [
        "chat",
        fullvocab_model(),
        "-t",
        "0",
        "-n",
        "2",
        "--no-history",
    ];
    let mut t = Pty::spawn(&args, &home);
    t.wait_for(">>> ", 0);
    t.keys("exit\r");
    let (status, out) = t.wait_exit();
    assert!(status.success(), "{out}");
    assert!(!out.contains("tok/s"), "exit was sent as a message: {out}");
}

#[test]
fn history_is_recalled_in_the_next_run_unless_turned_off() {
    let home = binary_dir().join("home-history");
    let data = home.join(".local/share/qwen3");
    std::fs::create_dir_all(&data).unwrap();
    // A history as a previous run left it (rustyline's file format).
    let run = |extra: &[&str]| {
        let mut args = vec![
            "chat",
            fullvocab_model(),
            "-t",
            "0",
            "-n",
            "2",
            "--thinking",
            "off",
            "--verbose-prompt",
        ];
        args.extend_from_slice(extra);
        let mut t = Pty::spawn(&args, &home);
        let prompt = t.wait_for(">>> ", 0);
        t.keys("What is 2 + 2?\r");
        let done = t.wait_for("tok/s", prompt);
        t.wait_for(">>> ", done);
        t.keys("\x04");
        let (status, out) = t.wait_exit();
        assert!(status.success(), "{out}");
    };
    run(&[]);
    let saved = std::fs::read_to_string(data.join("chat_history")).unwrap();
    assert!(saved.contains("What is 2 + 2?"), "{saved}");

    // Up at the prompt brings the last run's line back, and Enter sends it.
    let mut t = Pty::spawn(
        &[
            "chat",
            fullvocab_model(),
            "-t",
            "0",
            "-n",
            "2",
            "--verbose-prompt",
        ],
        &home,
    );
    let prompt = t.wait_for(">>> ", 0);
    t.keys("\x1b[A\r");
    let ids = t.wait_for(
        "prompt ids: [151644,872,198,3838,374,220,17,488,220,17,30,",
        prompt,
    );
    t.wait_for(">>> ", ids);
    t.keys("\x04");
    let (status, out) = t.wait_exit();
    assert!(status.success(), "{out}");

    // --no-history neither reads nor writes it.
    let other = binary_dir().join("home-no-history");
    std::fs::create_dir_all(&other).unwrap();
    let mut t = Pty::spawn(
        &[
            "chat",
            fullvocab_model(),
            "-t",
            "0",
            "-n",
            "2",
            "--no-history",
            "--thinking",
            "off",
        ],
        &other,
    );
    let prompt = t.wait_for(">>> ", 0);
    t.keys("Hi\r");
    let done = t.wait_for("tok/s", prompt);
    t.wait_for(">>> ", done);
    t.keys("\x04");
    let (status, out) = t.wait_exit();
    assert!(status.success(), "{out}");
    assert!(!other.join(".local/share/qwen3").exists());
}

/// Ctrl-C typed at the terminal during an export: it stops, exit 130, and leaves no file; a run
/// that finished first left all three. At least one run is interrupted.
#[test]
fn ctrl_c_at_the_terminal_during_export_leaves_nothing() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-fullvocab");
    let mut interrupted = 0;
    for delay_ms in [30, 100, 200, 350] {
        let out_dir = binary_dir().join(format!("export-{delay_ms}"));
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join("m.bin");
        let args = [
            "export",
            src.to_str().unwrap(),
            out.to_str().unwrap(),
            "--dtype",
            "f32",
        ];
        let mut t = Pty::spawn(&args, &binary_dir().join("home-export"));
        std::thread::sleep(Duration::from_millis(delay_ms));
        t.keys("\x03");
        let (status, log) = t.wait_exit();
        let mut left: Vec<String> = std::fs::read_dir(&out_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        if status.success() {
            assert_eq!(
                left,
                ["m.bin", "m.template.json", "m.tokenizer.bin"],
                "{log}"
            );
        } else {
            assert_eq!(status.code(), Some(130), "{log}");
            assert!(
                log.contains("interrupted; the partial files were removed"),
                "{log}"
            );
            assert!(left.is_empty(), "after {delay_ms} ms: {left:?}\n{log}");
            interrupted += 1;
        }
    }
    assert!(
        interrupted > 0,
        "no run was interrupted: the export is too fast for this test"
    );
}

/// Seconds from the "prompt ids:" line of a piped chat fed `message` to the end of its turn, with
/// Ctrl-C typed at its terminal `interrupt_after` seconds after that line if given; and whether
/// the turn was interrupted.
fn long_prefill(message: &str, interrupt_after: Option<f64>) -> (f64, bool) {
    let args = [
        "chat",
        fullvocab_model(),
        "-t",
        "0",
        "-n",
        "1",
        "-c",
        "16384",
        "--verbose-prompt",
    ];
    let mut t = Pty::spawn_with(
        &args,
        &binary_dir().join("home-prefill"),
        Some(&format!("{message}\n")),
    );
    let ids = t.wait_for("prompt ids:", 0);
    let start = Instant::now();
    if let Some(after) = interrupt_after {
        std::thread::sleep(Duration::from_secs_f64(after));
        t.keys("\x03");
    }
    let end = t.wait_for("tok/s", ids);
    let secs = start.elapsed().as_secs_f64();
    let interrupted = t.output()[ids..end].contains("[interrupted");
    let (status, out) = t.wait_exit();
    assert!(status.success(), "{out}");
    (secs, interrupted)
}

/// Ctrl-C typed during a long prompt's prefill acts within a chunk of it: the turn ends well
/// before the full prefill's time (measured first on the same prompt).
#[test]
fn ctrl_c_at_the_terminal_during_a_long_prefill_stops_it_early() {
    let message = "lorem ipsum dolor sit amet ".repeat(2400); // ~12000 tokens
    let (full, interrupted) = long_prefill(&message, None);
    assert!(!interrupted);
    let wait = full * 0.15;
    let (total, interrupted) = long_prefill(&message, Some(wait));
    assert!(interrupted, "not interrupted");
    assert!(
        total - wait < full * 0.7,
        "Ctrl-C took {:.2} s to act; the whole prefill takes {full:.2} s",
        total - wait
    );
}

/// On a terminal, bench says where it is while it runs (erased before the table).
#[test]
fn bench_shows_progress_on_a_terminal() {
    let args = [
        "bench",
        fullvocab_model(),
        "--prompt-tokens",
        "4",
        "-n",
        "2",
        "-r",
        "2",
        "--threads",
        "1",
    ];
    let t = Pty::spawn(&args, &binary_dir().join("home-bench"));
    let (status, out) = t.wait_exit();
    assert!(status.success(), "{out}");
    assert!(out.contains("1 thread: repeat 2 of 2"), "{out}");
    assert!(out.contains("decode tok/s"), "{out}");
}

/// On a terminal, `qwen3 batch` shows a progress bar: done/total requests and tokens/s.
#[test]
fn batch_shows_a_progress_bar_on_a_terminal() {
    let input = binary_dir().join("batch-in.jsonl");
    let lines: Vec<String> = (0..3)
        .map(|i| {
            format!(
                r#"{{"custom_id": "r{i}", "method": "POST", "url": "/v1/completions", "body": {{"prompt": "Hello {i}", "max_tokens": 4, "temperature": 0}}}}"#
            )
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let output = binary_dir().join("batch-out.jsonl");
    let _ = std::fs::remove_file(&output);
    let args = [
        "batch",
        fullvocab_model(),
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
    ];
    let t = Pty::spawn(&args, &binary_dir().join("home-batch"));
    let (status, out) = t.wait_exit();
    assert!(status.success(), "{out}");
    assert!(out.contains("3/3 requests"), "{out}");
    assert!(out.contains("tok/s"), "{out}");
    assert_eq!(std::fs::read_to_string(&output).unwrap().lines().count(), 3);
}
