//! The sockets under the HTTP client. ureq opens the TCP connection; the
//! connector here takes it over (TLS or none), so that every read waits in
//! slices of `SLICE` and, between slices, asks its `Guard` whether to go
//! on: a SIGINT/SIGTERM, a stop from the consumer (it failed: nothing more
//! is read), `--round-timeout`, an answer that is not whole within
//! `--timeout` (headers, documents), or a body that stalls (less than
//! `STALL_BYTES` in `--timeout` of waiting) end the read within a slice,
//! whatever the peer does. A connection is never pooled: dropping its
//! reader closes it, nothing is drained.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sys;

/// How long a read blocks before it looks at its guard again.
const SLICE: Duration = Duration::from_millis(100);

/// Less than this in `--timeout` of waiting is a stalled body.
pub const STALL_BYTES: u64 = 1024;

/// Why a transfer was ended from this side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Abort {
    /// The consumer failed: the rest is not wanted.
    Stopped,
    /// SIGINT or SIGTERM.
    Signal(i32),
    /// Headers or a document not whole within `--timeout`.
    Late(Duration),
    /// A body that delivered less than `STALL_BYTES` in `--timeout`.
    Stalled(Duration),
    /// `--round-timeout` passed.
    Round(Duration),
}

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = |d: &Duration| humantime::format_duration(*d).to_string();
        match self {
            Abort::Stopped => f.write_str("the transfer was stopped"),
            Abort::Signal(sig) => write!(f, "interrupted by {}", sys::signal_name(*sig)),
            Abort::Late(t) => write!(
                f,
                "the answer did not arrive whole within {} (--timeout)",
                d(t)
            ),
            Abort::Stalled(t) => write!(
                f,
                "the download stalled for {} (--timeout): less than 1 KiB came in that time",
                d(t)
            ),
            Abort::Round(t) => write!(f, "the sync took longer than {} (--round-timeout)", d(t)),
        }
    }
}

impl std::error::Error for Abort {}

impl Abort {
    pub fn io(&self) -> io::Error {
        let kind = match self {
            Abort::Late(_) | Abort::Stalled(_) | Abort::Round(_) => io::ErrorKind::TimedOut,
            // Not `Interrupted`: std's readers retry that.
            Abort::Stopped | Abort::Signal(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, self.clone())
    }
}

/// What one request may still do, shared by its socket and its `Body`.
#[derive(Debug)]
pub struct Guard {
    timeout: Duration,
    /// The whole answer by then, until `stream` (headers, documents).
    deadline: Instant,
    /// `--round-timeout`: its end and its length.
    round: Option<(Instant, Duration)>,
    streaming: AtomicBool,
    stop: AtomicBool,
    window: Mutex<Window>,
    abort: Mutex<Option<Abort>>,
}

/// Time spent waiting for bytes and bytes got, since the last `STALL_BYTES`.
#[derive(Debug, Default)]
struct Window {
    waited: Duration,
    got: u64,
}

impl Guard {
    pub fn new(timeout: Duration, round: Option<(Instant, Duration)>) -> Arc<Guard> {
        Arc::new(Guard {
            timeout,
            deadline: Instant::now() + timeout,
            round,
            streaming: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            window: Mutex::new(Window::default()),
            abort: Mutex::new(None),
        })
    }

    /// From now on the body streams: a stall, not the deadline, ends it.
    pub fn stream(&self) {
        *self.window.lock().unwrap() = Window::default();
        self.streaming.store(true, Ordering::SeqCst);
    }

    /// Read nothing more: the next read (or the one waiting) fails.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Why this request was ended from this side, if it was.
    pub fn aborted(&self) -> Option<Abort> {
        self.abort.lock().unwrap().clone()
    }

    /// `Err` (and remembered) once the transfer must end.
    fn check(&self) -> io::Result<()> {
        let why = if self.stop.load(Ordering::SeqCst) {
            Some(Abort::Stopped)
        } else if let Some(sig) = sys::signals::pending() {
            Some(Abort::Signal(sig))
        } else if let Some((_, len)) = self.round.filter(|(end, _)| Instant::now() >= *end) {
            Some(Abort::Round(len))
        } else if self.streaming.load(Ordering::SeqCst) {
            (self.window.lock().unwrap().waited >= self.timeout)
                .then_some(Abort::Stalled(self.timeout))
        } else {
            (Instant::now() >= self.deadline).then_some(Abort::Late(self.timeout))
        };
        match why {
            None => Ok(()),
            Some(why) => {
                let e = why.io();
                self.abort.lock().unwrap().get_or_insert(why);
                Err(e)
            }
        }
    }

    /// `n` bytes came after `waited`.
    fn count(&self, n: usize, waited: Duration) {
        let mut w = self.window.lock().unwrap();
        w.waited += waited;
        w.got += n as u64;
        if w.got >= STALL_BYTES {
            *w = Window::default();
        }
    }
}

/// A TCP connection whose reads wait in slices, asking `guard` between them.
#[derive(Debug)]
pub struct Sliced {
    tcp: TcpStream,
    guard: Arc<Guard>,
}

impl Sliced {
    pub fn new(tcp: TcpStream, guard: Arc<Guard>, timeout: Duration) -> io::Result<Sliced> {
        tcp.set_read_timeout(Some(SLICE))?;
        tcp.set_write_timeout(Some(timeout))?;
        Ok(Sliced { tcp, guard })
    }
}

impl Read for Sliced {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            self.guard.check()?;
            let t0 = Instant::now();
            match self.tcp.read(buf) {
                Ok(n) => {
                    self.guard.count(n, t0.elapsed());
                    return Ok(n);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    self.guard.count(0, t0.elapsed());
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Write for Sliced {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.guard.check()?;
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// `None`: ureq must not set timeouts of its own on the socket.
impl ureq::ReadWrite for Sliced {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

/// TLS over a `Sliced` connection.
struct Tls(rustls::StreamOwned<rustls::ClientConnection, Sliced>);

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tls({:?})", self.0.sock)
    }
}

impl Read for Tls {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.0.read(buf) {
            // A close_notify is the end of the stream.
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted && is_close_notify(&e) => Ok(0),
            r => r,
        }
    }
}

fn is_close_notify(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|m| m.to_string().contains("CloseNotify"))
}

impl Write for Tls {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl ureq::ReadWrite for Tls {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

/// What ureq calls with each new connection of one request: TLS with
/// `tls`, or none (plain HTTP, which ureq is then asked for as `https://`
/// so that it comes here too).
pub struct Connector {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub guard: Arc<Guard>,
    pub timeout: Duration,
}

impl ureq::TlsConnector for Connector {
    fn connect(
        &self,
        dns_name: &str,
        io: Box<dyn ureq::ReadWrite>,
    ) -> Result<Box<dyn ureq::ReadWrite>, ureq::Error> {
        // ureq hands over its TcpStream; a second handle on the same socket
        // is kept, the first one closed.
        let tcp = io
            .socket()
            .ok_or_else(|| io::Error::other("no socket"))?
            .try_clone()?;
        drop(io);
        let mut sliced = Sliced::new(tcp, self.guard.clone(), self.timeout)?;
        let Some(cfg) = &self.tls else {
            return Ok(Box::new(sliced));
        };
        let bare = dns_name.trim_start_matches('[').trim_end_matches(']');
        let name = rustls_pki_types::ServerName::try_from(bare.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut conn =
            rustls::ClientConnection::new(cfg.clone(), name).map_err(io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut sliced)?;
        }
        Ok(Box::new(Tls(rustls::StreamOwned::new(conn, sliced))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A peer that sends `chunk` every `every` until the test ends.
    fn trickle(chunk: &'static [u8], every: Duration) -> TcpStream {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            while s.write_all(chunk).is_ok() {
                std::thread::sleep(every);
            }
        });
        TcpStream::connect(addr).unwrap()
    }

    fn drain(s: &mut Sliced) -> io::Error {
        let mut buf = [0u8; 4096];
        for _ in 0..10_000 {
            if let Err(e) = s.read(&mut buf) {
                return e;
            }
        }
        panic!("the read never ended");
    }

    #[test]
    fn a_trickling_body_is_a_stall_and_a_trickling_answer_is_late() {
        let t = Duration::from_millis(300);
        let g = Guard::new(t, None);
        g.stream();
        let mut s = Sliced::new(trickle(b"x", Duration::from_millis(20)), g.clone(), t).unwrap();
        let e = drain(&mut s);
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(g.aborted(), Some(Abort::Stalled(t)), "{e}");

        let g = Guard::new(t, None);
        let mut s = Sliced::new(trickle(b"x", Duration::from_millis(20)), g.clone(), t).unwrap();
        drain(&mut s);
        assert_eq!(g.aborted(), Some(Abort::Late(t)));
    }

    #[test]
    fn a_body_at_a_kib_per_window_is_not_a_stall_but_the_round_ends_it() {
        let t = Duration::from_millis(400);
        let round = Duration::from_millis(900);
        let g = Guard::new(t, Some((Instant::now() + round, round)));
        g.stream();
        let chunk: &'static [u8] = &[7u8; 2048];
        let mut s = Sliced::new(trickle(chunk, Duration::from_millis(50)), g.clone(), t).unwrap();
        drain(&mut s);
        assert_eq!(g.aborted(), Some(Abort::Round(round)));
    }

    #[test]
    fn a_stop_ends_a_waiting_read() {
        let t = Duration::from_secs(30);
        let g = Guard::new(t, None);
        g.stream();
        let mut s = Sliced::new(trickle(b"", Duration::from_secs(60)), g.clone(), t).unwrap();
        let stopper = g.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            stopper.stop();
        });
        let e = drain(&mut s);
        assert_eq!(g.aborted(), Some(Abort::Stopped), "{e}");
    }
}
