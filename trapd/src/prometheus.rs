//! trapd's Prometheus endpoint: `GET /metrics` on the configuration's `listen` address (off
//! when it is not set) answers the text exposition format that [`crate::exposition`] renders.
//!
//! A scrape asks the daemon what any client may ask, `list` and `status`, under one hold of its
//! lock (so the splices, the profile and its switch count agree), and adds the server's
//! [`RequestCounts`]. It changes nothing and is not counted as a request.
//!
//! The HTTP side is the least that Prometheus needs: `GET`, one request per connection
//! (`Connection: close`), connections served one at a time with a 5 s timeout on each read
//! and write, the request head limited to 8 KiB. Anything else gets a 4xx. No authentication:
//! the exposition carries kernel addresses (splice sites), so bind it to loopback or a
//! monitoring network only (trapd/README.md, "Prometheus metrics").

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

use crate::exposition::{self, DaemonStats};
use instr_manager::ops::Listing;
use serde_json::Value;

use super::protocol::Request;
use super::server::{self, Handler, RequestCounts};

/// The longest request head (request line and headers) read.
const MAX_HEAD: u64 = 8 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why a scrape could not be answered (the reply is a 500 with this text).
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("trapd's `{op}` failed: {error}")]
    Daemon { op: &'static str, error: String },
    #[error("trapd's `{op}` reply does not read as expected: {source}")]
    Reply {
        op: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// The exposition now: the daemon's `list` and `status`, and the requests counted so far.
pub fn exposition<H: Handler>(
    handler: &Mutex<H>,
    counts: &RequestCounts,
) -> Result<String, ScrapeError> {
    let (list, status) = {
        let mut h = server::lock(handler);
        (h.handle(Request::List), h.handle(Request::Status))
    };
    let listing: Listing = reply("list", list)?;
    let mut stats: DaemonStats = reply("status", status)?;
    stats.requests = counts.snapshot();
    Ok(exposition::render(&listing, Some(&stats)))
}

fn reply<R: serde::de::DeserializeOwned>(op: &'static str, v: Value) -> Result<R, ScrapeError> {
    if v["ok"] != Value::Bool(true) {
        return Err(ScrapeError::Daemon {
            op,
            error: v["error"].as_str().unwrap_or("no error given").to_string(),
        });
    }
    serde_json::from_value(v).map_err(|source| ScrapeError::Reply { op, source })
}

/// Bind the endpoint's address.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
}

/// Answer scrapes for ever, one connection at a time.
pub fn serve<H: Handler>(listener: &TcpListener, handler: &Mutex<H>, counts: &RequestCounts) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                if let Err(e) = answer(stream, handler, counts) {
                    log::debug!("metrics connection: {e}");
                }
            }
            Err(e) => log::warn!("metrics accept: {e}"),
        }
    }
}

/// Read one request head and answer it.
fn answer<H: Handler>(
    mut stream: TcpStream,
    handler: &Mutex<H>,
    counts: &RequestCounts,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let mut reader = BufReader::new((&stream).take(MAX_HEAD));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers are read (to the blank line) and ignored: nothing in them changes the reply.
    let mut complete = false;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        if line == "\r\n" || line == "\n" {
            complete = true;
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = target.split('?').next().unwrap_or_default();
    log::debug!("metrics request from {peer}: {}", request_line.trim_end());
    let (status, content_type, body) = if !complete {
        (
            "400 Bad Request",
            "text/plain",
            "incomplete or oversized request head\n".to_string(),
        )
    } else if method != "GET" {
        (
            "405 Method Not Allowed",
            "text/plain",
            format!("{method}: only GET is served\n"),
        )
    } else if path != "/metrics" {
        (
            "404 Not Found",
            "text/plain",
            format!("{path}: the metrics are at /metrics\n"),
        )
    } else {
        match exposition(handler, counts) {
            Ok(text) => ("200 OK", exposition::CONTENT_TYPE, text),
            Err(e) => {
                log::warn!("metrics scrape from {peer}: {e}");
                ("500 Internal Server Error", "text/plain", format!("{e}\n"))
            }
        }
    };
    let allow = if status.starts_with("405") {
        "Allow: GET\r\n"
    } else {
        ""
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()?;
    // Closing with unread input (a head cut at MAX_HEAD, a body) would reset the connection
    // and could lose the reply: stop sending, then drop what the client still sends, for at
    // most a second and 64 KiB.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    let _ = std::io::copy(&mut (&stream).take(64 << 10), &mut std::io::sink());
    Ok(())
}
