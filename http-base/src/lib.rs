//! The one HTTP/1.1 and TLS base of shardport's endpoints: the control
//! endpoint (`shardport-control`) and the http transport (`plugins/http`)
//! read heads, bound sockets and set up TLS with this crate alone, so there
//! is one hostile-input surface to review and fuzz, not two.
//!
//! - [`head`]: strict, bounded HTTP/1.1 heads ([`head::Rules`] names what
//!   the readers accept differently on purpose);
//! - [`DeadlineStream`]: a socket whose reads share one deadline, however
//!   a peer paces its bytes;
//! - [`tls`]: rustls (ring provider) configs from PEM files, the name a
//!   client checks, and handshake failures explained.
//!
//! The pending-connection budget both servers use is in the plugin kit
//! (`shardport_kit::admission`). This crate depends on neither the host
//! nor the ABI: a transport plugin (a cdylib over `abi` and `kit`) links it
//! as it is.
//!
//! Where to start: [`head`]'s module docs list what is refused and why.
//!
//! ```
//! use shardport_http_base::head::{self, LineEnds, Rules, Values};
//!
//! let rules = Rules {
//!     max_bytes: 16 * 1024,
//!     max_fields: 64,
//!     line_ends: LineEnds::CrLf,
//!     values: Values::Visible,
//!     max_length_digits: 20,
//! };
//! let buf = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi";
//! let n = head::head_len(buf, &rules).unwrap().expect("a complete head");
//! let mut lines = head::lines(&buf[..n], rules.line_ends);
//! assert_eq!(lines.next(), Some(Ok(&b"HTTP/1.1 200 OK"[..])));
//! let fields: Vec<_> = lines
//!     .map(|l| head::field(l.unwrap(), rules.values).unwrap())
//!     .collect();
//! assert_eq!(head::framing(fields, rules.max_length_digits), Ok(Some(2)));
//! assert_eq!(&buf[n..], b"hi");
//! ```

#![forbid(unsafe_code)]

mod deadline;
pub mod head;
pub mod syntax;
pub mod tls;

pub use deadline::DeadlineStream;
