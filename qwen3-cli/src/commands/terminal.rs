//! What the terminal chat does to its terminal beyond the line editor: keys typed while an answer
//! streams stay out of it, and the editor's history lives in a file between runs.

use std::path::PathBuf;

/// While it lives, the terminal on stdin does not echo keys, so what the user types during an
/// answer does not land in the middle of the answer's text; dropped, it restores the terminal's
/// settings and discards what was typed meanwhile (a stray Enter would otherwise send it as the
/// next message). Ctrl-C still interrupts: only ECHO is turned off, not ISIG.
///
/// Does nothing when stdin is not a terminal, or off Unix.
pub struct QuietKeys {
    #[cfg(unix)]
    saved: Option<libc::termios>,
}

impl QuietKeys {
    #[cfg(unix)]
    pub fn new() -> QuietKeys {
        // SAFETY: tcgetattr writes a `termios` (plain integers and arrays, for which all-zero is
        // a valid value) through a pointer to our local, and only reads fd 0; on failure (stdin
        // is not a terminal) it returns -1 and we keep nothing.
        let saved = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            (libc::tcgetattr(libc::STDIN_FILENO, &mut t) == 0).then_some(t)
        };
        if let Some(t) = saved {
            let mut quiet = t;
            quiet.c_lflag &= !libc::ECHO;
            // SAFETY: tcsetattr reads the `termios` we pass by pointer (a copy of the one the
            // terminal gave us, with ECHO cleared); it affects only the terminal on fd 0.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &quiet) };
        }
        QuietKeys { saved }
    }

    #[cfg(not(unix))]
    pub fn new() -> QuietKeys {
        QuietKeys {}
    }
}

impl Drop for QuietKeys {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(t) = &self.saved {
            // SAFETY: as in `new`: the settings read from this terminal, passed by pointer to a
            // live value; tcflush only drops the terminal's pending input on fd 0.
            unsafe {
                libc::tcflush(libc::STDIN_FILENO, libc::TCIFLUSH);
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t);
            }
        }
    }
}

/// Where the chat keeps its input history: `$XDG_DATA_HOME/qwen3/chat_history`, or
/// `~/.local/share/qwen3/chat_history` (the XDG base directory rule; `None` without a home).
pub fn history_file() -> Option<PathBuf> {
    let data = match std::env::var_os("XDG_DATA_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            PathBuf::from(std::env::var_os("HOME").filter(|h| !h.is_empty())?).join(".local/share")
        }
    };
    Some(data.join("qwen3").join("chat_history"))
}
