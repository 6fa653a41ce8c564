//! The kubelet's plugin watcher dials a registration socket by its bare path (`grpc.DialContext(ctx, "/…/x-reg.sock")`),
//! so grpc-go sends that path as the HTTP/2 `:authority` of every call. tonic's HTTP/2 layer (h2) refuses a request
//! whose authority is not a URI authority (`/` is not allowed there): it resets the stream with PROTOCOL_ERROR
//! (hyperium/h2#487, open), and the kubelet logs "failed to get plugin info using RPC GetInfo ... RST_STREAM". The
//! plugin never registers.
//!
//! So the bytes the kubelet sends pass through [`Rewriter`] before h2 reads them: in each complete HEADERS frame, a
//! literal `:authority` field gets the value `localhost` (what grpc-go itself sends for `unix:` targets); everything
//! else passes unchanged. HPACK stays consistent: only the value of a literal field changes, so both sides' dynamic
//! tables hold the same entries in the same order (the server's smaller entry is evicted no earlier than the
//! client's, and the client never refers past its own table). A frame this cannot read passes unchanged, and h2
//! decides as before.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixStream;

/// The HTTP/2 client connection preface, passed through as it is.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `:authority` in HPACK's static table.
const AUTHORITY_INDEX: u64 = 1;
const REPLACEMENT: &[u8] = b"localhost";

/// Rewrites the client-to-server bytes of one HTTP/2 connection (see the module doc).
#[derive(Debug, Default)]
pub struct Rewriter {
    preface_seen: usize,
    pending: Vec<u8>,
}

impl Rewriter {
    /// Takes the bytes read from the client and returns what to hand to the server now; an incomplete frame is
    /// kept until the rest arrives.
    pub fn feed(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len());
        let mut input = input;
        if self.preface_seen < PREFACE_LEN {
            let take = (PREFACE_LEN - self.preface_seen).min(input.len());
            out.extend_from_slice(&input[..take]);
            self.preface_seen += take;
            input = &input[take..];
        }
        self.pending.extend_from_slice(input);
        let mut at = 0;
        while let Some(header) = self.pending.get(at..at + FRAME_HEADER_LEN) {
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            let Some(payload) = self
                .pending
                .get(at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + len)
            else {
                break;
            };
            match (kind == HEADERS && flags & END_HEADERS != 0)
                .then(|| rewrite_headers(flags, payload))
                .flatten()
                .and_then(|new| {
                    u32::try_from(new.len())
                        .ok()
                        .filter(|l| *l < 1 << 24)
                        .map(|l| (l, new))
                }) {
                Some((new_len, new)) => {
                    out.extend_from_slice(&new_len.to_be_bytes()[1..]);
                    out.extend_from_slice(&header[3..]);
                    out.extend_from_slice(&new);
                }
                None => out.extend_from_slice(&self.pending[at..at + FRAME_HEADER_LEN + len]),
            }
            at += FRAME_HEADER_LEN + len;
        }
        self.pending.drain(..at);
        out
    }
}

/// The payload of a HEADERS frame with each literal `:authority` value replaced, or `None` when there is none or
/// the block cannot be read.
pub fn rewrite_headers(flags: u8, payload: &[u8]) -> Option<Vec<u8>> {
    let mut start = 0;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        start += 1;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    let block = payload.get(start..end)?;
    let mut out = payload.get(..start)?.to_vec();
    let mut changed = false;
    let mut at = 0;
    while at < block.len() {
        let first = block[at];
        let (prefix, literal) = match first {
            b if b & 0x80 != 0 => (7, false),
            b if b & 0xC0 == 0x40 => (6, true),
            b if b & 0xE0 == 0x20 => (5, false),
            _ => (4, true),
        };
        let (index, after_index) = integer(block, at, prefix)?;
        if !literal {
            out.extend_from_slice(&block[at..after_index]);
            at = after_index;
            continue;
        }
        let mut after_name = after_index;
        let mut is_authority = index == AUTHORITY_INDEX;
        if index == 0 {
            let (name, next) = string(block, after_index)?;
            is_authority = name == Some(b":authority".as_slice());
            after_name = next;
        }
        let (_, after_value) = string(block, after_name)?;
        out.extend_from_slice(&block[at..after_name]);
        if is_authority {
            // A plain (not Huffman) string: length in the 7-bit prefix.
            out.push(u8::try_from(REPLACEMENT.len()).ok()?);
            out.extend_from_slice(REPLACEMENT);
            changed = true;
        } else {
            out.extend_from_slice(&block[after_name..after_value]);
        }
        at = after_value;
    }
    out.extend_from_slice(payload.get(end..)?);
    changed.then_some(out)
}

/// An HPACK integer with an `n`-bit prefix starting at `at`: its value and where it ends.
fn integer(block: &[u8], at: usize, n: u32) -> Option<(u64, usize)> {
    let max = (1u64 << n) - 1;
    let mut value = u64::from(*block.get(at)?) & max;
    let mut at = at + 1;
    if value < max {
        return Some((value, at));
    }
    let mut shift = 0u32;
    loop {
        let byte = *block.get(at)?;
        at += 1;
        value = value.checked_add(u64::from(byte & 0x7F).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// An HPACK string at `at`: its bytes when not Huffman-coded (`None` when they are), and where it ends.
fn string(block: &[u8], at: usize) -> Option<(Option<&[u8]>, usize)> {
    let huffman = *block.get(at)? & 0x80 != 0;
    let (len, start) = integer(block, at, 7)?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    let bytes = block.get(start..end)?;
    Some(((!huffman).then_some(bytes), end))
}

/// An accepted connection as the gRPC server reads it: the client's bytes through a [`Rewriter`].
#[derive(Debug)]
pub struct Rewritten(DuplexStream);

/// Puts `client` behind a [`Rewriter`]; a task moves the bytes both ways until either side closes.
pub fn rewritten(client: UnixStream) -> Rewritten {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(pump(client, theirs));
    Rewritten(ours)
}

async fn pump(client: UnixStream, server: DuplexStream) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let up = async {
        let mut rewriter = Rewriter::default();
        let mut buf = vec![0; 16 * 1024];
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            server_write.write_all(&rewriter.feed(&buf[..n])).await?;
        }
        server_write.shutdown().await
    };
    let down = async {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    // A connection ends when a side closes or fails; either way there is nothing to report.
    let _ = tokio::join!(up, down);
}

impl AsyncRead for Rewritten {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewritten {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Rewritten {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A literal field without indexing, indexed name, plain value.
    fn literal(name_index: u8, value: &[u8]) -> Vec<u8> {
        let mut out = vec![name_index, u8::try_from(value.len()).unwrap()];
        out.extend_from_slice(value);
        out
    }

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut out = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 1];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn a_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (indexed)
        block.extend(literal(4, b"/pluginregistration.Registration/GetInfo"));
        block.extend(literal(
            1,
            b"/var/lib/kubelet/plugins_registry/vm.peerpods.io-reg.sock",
        ));
        block.extend([0x40, 2, b't', b'e', 8]); // literal with indexing, new name "te"
        block.extend(b"trailers");
        let rewritten = rewrite_headers(END_HEADERS, &block).unwrap();
        let mut want = vec![0x83, 0x86];
        want.extend(literal(4, b"/pluginregistration.Registration/GetInfo"));
        want.extend(literal(1, b"localhost"));
        want.extend([0x40, 2, b't', b'e', 8]);
        want.extend(b"trailers");
        assert_eq!(rewritten, want);
    }

    #[test]
    fn padding_priority_and_a_literal_name_are_handled() {
        let mut block = vec![0x00, 10];
        block.extend(b":authority");
        block.extend([3]);
        block.extend(b"/x/");
        let mut payload = vec![2]; // pad length
        payload.extend([0, 0, 0, 0, 16]); // priority
        payload.extend(&block);
        payload.extend([0, 0]);
        let rewritten = rewrite_headers(END_HEADERS | PADDED | PRIORITY, &payload).unwrap();
        assert_eq!(&rewritten[..6], &payload[..6]);
        assert!(
            rewritten.ends_with(b"\x09localhost\x00\x00"),
            "{rewritten:?}"
        );
    }

    #[test]
    fn nothing_to_change_or_unreadable_is_none() {
        assert_eq!(rewrite_headers(END_HEADERS, &[0x83, 0x86]), None);
        assert_eq!(
            rewrite_headers(END_HEADERS, &[0x01, 40, b'/']),
            None,
            "value cut short"
        );
        assert_eq!(
            rewrite_headers(PADDED, &[9, 0x83]),
            None,
            "padding longer than the frame"
        );
    }

    #[test]
    fn frames_split_anywhere_come_out_whole_and_rewritten() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let mut input = preface.to_vec();
        input.extend(frame(0x4, 0, &[])); // SETTINGS
        input.extend(frame(HEADERS, END_HEADERS, &literal(1, b"/a/b.sock")));
        input.extend(frame(0x0, 0x1, &[0, 0, 0, 0, 0])); // DATA
        let mut want = preface.to_vec();
        want.extend(frame(0x4, 0, &[]));
        want.extend(frame(HEADERS, END_HEADERS, &literal(1, b"localhost")));
        want.extend(frame(0x0, 0x1, &[0, 0, 0, 0, 0]));
        for split in 0..input.len() {
            let mut rewriter = Rewriter::default();
            let mut out = rewriter.feed(&input[..split]);
            out.extend(rewriter.feed(&input[split..]));
            assert_eq!(out, want, "split at {split}");
        }
    }
}
