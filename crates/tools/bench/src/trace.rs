//! Block traces as timed requests for an open-loop replay: parsers of the SNIA/MSR Cambridge CSV
//! and blkparse text formats, and the EMC-tel-like generator of seed 004 §4.2.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::io::BufRead;

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// When it is issued, in seconds from the start of the trace.
    pub at: f64,
    pub write: bool,
    /// Bytes from the start of the device.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// The text formats a trace may come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// SNIA IOTTA / MSR Cambridge CSV: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`,
    /// timestamps in Windows filetime ticks of 100 ns.
    Msr,
    /// `blkparse` text output in its default format, one event per line.
    Blkparse,
}

/// What a trace line got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    #[error("not UTF-8 text")]
    NotText,
    #[error("{found} fields where {expected} were expected")]
    Fields { expected: &'static str, found: usize },
    #[error("{field} is not a number: {text:?}")]
    Number { field: &'static str, text: String },
    #[error("request type {0:?} is neither Read nor Write")]
    Type(String),
    #[error("the request ends past 2^64 bytes")]
    Overflow,
}

/// Why a trace cannot be read or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("trace line {line}: {error}")]
    Line { line: u64, error: LineError },
    #[error("cannot tell the trace's format from its first line (give --format msr or blkparse)")]
    UnknownFormat,
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read the trace: {0}")]
    Io(#[from] std::io::Error),
}

/// Which requests of a trace are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    /// MSR: only this DiskNumber (default: every disk).
    pub disk: Option<u32>,
    /// blkparse: the action whose events are the requests (default `Q`, queued: when the
    /// application asked, before any scheduling of the traced machine).
    pub action: char,
}

impl Default for Filter {
    fn default() -> Filter {
        Filter { disk: None, action: 'Q' }
    }
}

impl Format {
    /// The format of a trace whose start is `head`, from its first line that is neither blank
    /// nor a `#` comment; `None` when that line looks like neither.
    pub fn detect(head: &[u8]) -> Option<Format> {
        let text = String::from_utf8_lossy(head);
        let line = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'))?;
        if line.split(',').count() >= 6 {
            return Some(Format::Msr);
        }
        let first = line.split_whitespace().next()?;
        let (major, minor) = first.split_once(',')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        (digits(major) && digits(minor)).then_some(Format::Blkparse)
    }
}

/// The requests of a trace read from `reader`, in file order, with their times from the first
/// request kept. After the first error it yields nothing more.
#[derive(Debug)]
pub struct Parser<R> {
    reader: R,
    format: Format,
    filter: Filter,
    line: u64,
    buf: Vec<u8>,
    /// The first kept request's time stamp, in the format's own unit.
    origin: Option<Origin>,
    done: bool,
}

#[derive(Debug, Clone, Copy)]
enum Origin {
    Ticks(u64),
    Secs(f64),
}

impl<R: BufRead> Parser<R> {
    pub fn new(reader: R, format: Format, filter: Filter) -> Parser<R> {
        Parser { reader, format, filter, line: 0, buf: Vec::new(), origin: None, done: false }
    }

    /// A parser for the format [`Format::detect`] finds in the reader's first buffer.
    pub fn detect(mut reader: R, filter: Filter) -> Result<Parser<R>, TraceError> {
        let format = Format::detect(reader.fill_buf()?).ok_or(TraceError::UnknownFormat)?;
        Ok(Parser::new(reader, format, filter))
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The next request, `Ok(None)` at the end.
    fn step(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            self.buf.clear();
            if self.reader.read_until(b'\n', &mut self.buf)? == 0 {
                return Ok(None);
            }
            self.line += 1;
            let at_line = |error| TraceError::Line { line: self.line, error };
            let text = std::str::from_utf8(&self.buf).map_err(|_| at_line(LineError::NotText))?.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            let parsed = match self.format {
                Format::Msr => msr_line(text, self.filter.disk),
                Format::Blkparse => blkparse_line(text, self.filter.action),
            };
            let Some((stamp, mut req)) = parsed.map_err(at_line)? else { continue };
            req.at = match (stamp, *self.origin.get_or_insert(stamp)) {
                // Requests stamped before the first are issued with it: a replay cannot go back.
                (Origin::Ticks(t), Origin::Ticks(t0)) => t.saturating_sub(t0) as f64 * 1e-7,
                (Origin::Secs(t), Origin::Secs(t0)) => (t - t0).max(0.0),
                _ => 0.0,
            };
            return Ok(Some(req));
        }
    }
}

impl<R: BufRead> Iterator for Parser<R> {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}

fn number<T: std::str::FromStr>(field: &'static str, text: &str) -> Result<T, LineError> {
    text.trim().parse().map_err(|_| LineError::Number { field, text: text.trim().chars().take(40).collect() })
}

/// One MSR line: `Timestamp,Hostname,DiskNumber,Type,Offset,Size[,ResponseTime]`; `None` for
/// the header line or another disk.
fn msr_line(text: &str, disk: Option<u32>) -> Result<Option<(Origin, Request)>, LineError> {
    let f: Vec<&str> = text.split(',').collect();
    let (stamp, disk_text, kind, offset, size, response) = match *f.as_slice() {
        [stamp, _, disk, kind, offset, size] => (stamp, disk, kind, offset, size, None),
        [stamp, _, disk, kind, offset, size, response] => (stamp, disk, kind, offset, size, Some(response)),
        _ => return Err(LineError::Fields { expected: "6 or 7", found: f.len() }),
    };
    if stamp.trim().eq_ignore_ascii_case("timestamp") {
        return Ok(None);
    }
    let ticks: u64 = number("Timestamp", stamp)?;
    let number_of_disk: u32 = number("DiskNumber", disk_text)?;
    let write = match kind.trim() {
        t if t.eq_ignore_ascii_case("write") => true,
        t if t.eq_ignore_ascii_case("read") => false,
        t => return Err(LineError::Type(t.chars().take(40).collect())),
    };
    let offset: u64 = number("Offset", offset)?;
    let len: u64 = number("Size", size)?;
    if let Some(t) = response {
        number::<u64>("ResponseTime", t)?;
    }
    offset.checked_add(len).ok_or(LineError::Overflow)?;
    if disk.is_some_and(|d| d != number_of_disk) {
        return Ok(None);
    }
    Ok(Some((Origin::Ticks(ticks), Request { at: 0.0, write, offset, len })))
}

/// One blkparse line: `MAJ,MIN CPU SEQ SECS PID ACTION RWBS SECTOR + COUNT [PROCESS]`; `None` for
/// the summary, other actions and events that move no data (flushes, discards).
fn blkparse_line(text: &str, action: char) -> Result<Option<(Origin, Request)>, LineError> {
    let f: Vec<&str> = text.split_whitespace().collect();
    let device = f.first().and_then(|d| d.split_once(','));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !device.is_some_and(|(a, b)| digits(a) && digits(b)) {
        // The per-CPU and total summaries blkparse prints at the end.
        return Ok(None);
    }
    let [_, _, _, time, _, act, rwbs, ref rest @ ..] = *f.as_slice() else {
        return Err(LineError::Fields { expected: "at least 7", found: f.len() });
    };
    let mut a = [0u8; 4];
    if act != action.encode_utf8(&mut a) {
        return Ok(None);
    }
    let write = if rwbs.contains('W') {
        true
    } else if rwbs.contains('R') {
        false
    } else {
        return Ok(None);
    };
    let secs: f64 = number("time", time)?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(LineError::Number { field: "time", text: time.chars().take(40).collect() });
    }
    // A flush is queued as a write with no sector: `Q FWS [proc]`.
    if rest.first().is_none_or(|s| s.starts_with('[')) {
        return Ok(None);
    }
    let [sector, "+", count, ..] = *rest else {
        return Err(LineError::Fields { expected: "SECTOR + COUNT after RWBS", found: f.len() });
    };
    let sector: u64 = number("sector", sector)?;
    let count: u64 = number("sector count", count)?;
    if count == 0 {
        return Ok(None);
    }
    let offset = sector.checked_mul(512).ok_or(LineError::Overflow)?;
    let len = count.checked_mul(512).ok_or(LineError::Overflow)?;
    offset.checked_add(len).ok_or(LineError::Overflow)?;
    Ok(Some((Origin::Secs(secs), Request { at: 0.0, write, offset, len })))
}

/// The shape of a synthetic trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Bytes per request.
    pub size: u64,
    /// Percent of requests that write.
    pub write_pct: u32,
    /// Requests fall uniformly in the first this many bytes, aligned to their size.
    pub span: u64,
}

impl Shape {
    /// Seed 004's EMC-tel trace as §4.2 describes it: 4 blocks of 512 bytes, 89 % writes, a
    /// 900 MB data set.
    pub const EMC_TEL: Shape = Shape { size: 2048, write_pct: 89, span: 900_000_000 };
}

/// xorshift64*: small, seedable, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in (0, 1], so that its logarithm is finite.
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// `requests` requests shaped like seed 004's EMC-tel trace: Poisson arrivals at `rate` per
/// second, addresses uniform over `shape.span`, `shape.write_pct` % writes; the same sequence for
/// the same `seed` everywhere.
pub fn emc_tel(requests: u64, rate: f64, seed: u64, shape: Shape) -> Result<impl Iterator<Item = Request>, TraceError> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(TraceError::Invalid(format!("the request rate must be a positive number, not {rate}")));
    }
    if shape.size == 0 || shape.span < shape.size || shape.write_pct > 100 {
        return Err(TraceError::Invalid(format!(
            "{} % writes of {} bytes over {} bytes: a request must fit in the span and the percentage be at most 100",
            shape.write_pct, shape.size, shape.span
        )));
    }
    let slots = shape.span / shape.size;
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut at = 0.0f64;
    // The draws come in the order of the openloop example this replaced (time, address,
    // direction), so that a seed gives the same trace as before.
    Ok((0..requests).map(move |_| {
        at += -rng.unit().ln() / rate;
        let offset = (rng.next() % slots) * shape.size;
        let write = rng.next() % 100 < u64::from(shape.write_pct);
        Request { at, write, offset, len: shape.size }
    }))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(text: &[u8], format: Format) -> Vec<Result<Request, TraceError>> {
        Parser::new(text, format, Filter::default()).collect()
    }

    /// A corrupt trace, the line its error names and a test of the error.
    type Case = (&'static [u8], u64, fn(&LineError) -> bool);

    fn line_of(r: &Result<Request, TraceError>) -> Option<(u64, LineError)> {
        match r {
            Err(TraceError::Line { line, error }) => Some((*line, error.clone())),
            _ => None,
        }
    }

    const MSR: &[u8] = b"# from the MSR Cambridge set\n\
        Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n\
        128166372003061629,hm,0,Write,3154152960,4096,1137\n\
        \n\
        128166372003081629,hm,1,Read,512,1024,200\r\n\
        128166372013061629,hm,0,read,0,512\n";

    #[test]
    fn msr_lines_become_requests_from_the_first_time_stamp() {
        let r: Vec<Request> = parse(MSR, Format::Msr).into_iter().map(Result::unwrap).collect();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], Request { at: 0.0, write: true, offset: 3_154_152_960, len: 4096 });
        assert!((r[1].at - 0.002).abs() < 1e-9 && !r[1].write && r[1].offset == 512 && r[1].len == 1024);
        assert!((r[2].at - 1.0).abs() < 1e-9);
        let disk1: Vec<_> = Parser::new(MSR, Format::Msr, Filter { disk: Some(1), ..Filter::default() }).collect();
        assert_eq!(disk1.len(), 1);
        assert_eq!(disk1[0].as_ref().unwrap().at, 0.0);
    }

    #[test]
    fn corrupt_msr_lines_name_their_line() {
        let cases: &[Case] = &[
            (b"1,h,0,Write,0,512,1\n2,h,0,Write,0\n", 2, |e| matches!(e, LineError::Fields { found: 5, .. })),
            (b"1,h,0,Write,0,512,1\n\n2,h,0,Trim,0,512,1\n", 3, |e| matches!(e, LineError::Type(_))),
            (b"x,h,0,Write,0,512,1\n", 1, |e| matches!(e, LineError::Number { field: "Timestamp", .. })),
            (b"1,h,0,Write,-5,512,1\n", 1, |e| matches!(e, LineError::Number { field: "Offset", .. })),
            (b"1,h,0,Write,18446744073709551615,512,1\n", 1, |e| *e == LineError::Overflow),
            (b"1,h,0,Write,0,512,1\n\xff\xfe,h\n", 2, |e| *e == LineError::NotText),
        ];
        for (text, line, kind) in cases {
            let out = parse(text, Format::Msr);
            let (l, e) = out.iter().find_map(line_of).unwrap_or_else(|| panic!("no error in {out:?}"));
            assert_eq!(l, *line, "{e}");
            assert!(kind(&e), "{e}");
            assert!(out.last().is_some_and(Result::is_err), "stops at the error");
        }
    }

    const BLK: &[u8] = b"  8,0    1        1     0.000000000  1234  Q   W 1234567 + 8 [fio]\n\
          8,0    1        2     0.000001000  1234  G   W 1234567 + 8 [fio]\n\
          8,0    1        3     0.000002000  1234  P   N [fio]\n\
          8,0    0        4     0.250000000  1234  Q  RA 2048 + 16 [fio]\n\
          8,0    0        5     0.260000000  1234  Q FWS [fio]\n\
          8,0    0        6     0.270000000  1234  Q  DS 4096 + 8 [fio]\n\
          8,0    0        7     0.300000000  1234  C   W 1234567 + 8 [0]\n\
        \n\
        CPU0 (8,0):\n\
         Reads Queued:           1,        8KiB\t Writes Queued:           1,        4KiB\n\
        Total (8,0):\n";

    #[test]
    fn blkparse_keeps_the_chosen_action_with_data() {
        let r: Vec<Request> = parse(BLK, Format::Blkparse).into_iter().map(Result::unwrap).collect();
        assert_eq!(
            r,
            vec![
                Request { at: 0.0, write: true, offset: 1_234_567 * 512, len: 4096 },
                Request { at: 0.25, write: false, offset: 2048 * 512, len: 8192 },
            ]
        );
        let done: Vec<_> = Parser::new(BLK, Format::Blkparse, Filter { action: 'C', ..Filter::default() })
            .map(Result::unwrap)
            .collect();
        assert_eq!(done, vec![Request { at: 0.0, write: true, offset: 1_234_567 * 512, len: 4096 }]);
    }

    #[test]
    fn corrupt_blkparse_lines_name_their_line() {
        let cases: &[Case] = &[
            (b"8,0 1 1 0.0 1 Q W 8 + 8 [a]\n8,0 1 2 0.1 1 Q W x + 8 [a]\n", 2, |e| {
                matches!(e, LineError::Number { field: "sector", .. })
            }),
            (b"# c\n8,0 1 1 zero 1 Q W 8 + 8 [a]\n", 2, |e| matches!(e, LineError::Number { field: "time", .. })),
            (b"8,0 1 1 0.0 1 Q W 8 - 8 [a]\n", 1, |e| matches!(e, LineError::Fields { .. })),
            (b"8,0 1 1 0.0 1\n", 1, |e| matches!(e, LineError::Fields { found: 5, .. })),
            (b"8,0 1 1 NaN 1 Q W 8 + 8 [a]\n", 1, |e| matches!(e, LineError::Number { field: "time", .. })),
            (b"8,0 1 1 0.0 1 Q W 36028797018963968 + 8 [a]\n", 1, |e| *e == LineError::Overflow),
        ];
        for (text, line, kind) in cases {
            let out = parse(text, Format::Blkparse);
            let (l, e) = out.iter().find_map(line_of).unwrap_or_else(|| panic!("no error in {out:?}"));
            assert_eq!(l, *line, "{e}");
            assert!(kind(&e), "{e}");
        }
    }

    #[test]
    fn lines_cut_short_or_too_long_are_field_errors() {
        let cases: &[(&[u8], Format, usize)] = &[
            (b"1,h,0,Write,0,512,1,extra\n", Format::Msr, 8),
            (b",\n", Format::Msr, 2),
            (b"8,0 1 1 0.0 1 Q W 8\n", Format::Blkparse, 8),
            (b"8,0 1 1 0.0 1 Q W 8 +\n", Format::Blkparse, 9),
            (b"8,0 1 1 0.0 1 Q\n", Format::Blkparse, 6),
        ];
        for (text, format, found) in cases {
            let out = parse(text, *format);
            let (l, e) = out.iter().find_map(line_of).unwrap_or_else(|| panic!("no error in {out:?}"));
            assert_eq!(l, 1, "{e}");
            assert!(matches!(e, LineError::Fields { found: f, .. } if f == *found), "{e}");
        }
        // Seven fields but no data (a flush without its process) is no request and no error.
        assert!(parse(b"8,0 1 1 0.0 1 Q FWS\n", Format::Blkparse).is_empty());
    }

    #[test]
    fn formats_are_told_apart_by_their_first_line() {
        assert_eq!(Format::detect(MSR), Some(Format::Msr));
        assert_eq!(Format::detect(BLK), Some(Format::Blkparse));
        assert_eq!(Format::detect(b"\n# nothing\nhello world\n"), None);
        assert_eq!(Format::detect(b""), None);
        assert!(matches!(Parser::detect(&b"hello\n"[..], Filter::default()), Err(TraceError::UnknownFormat)));
        assert_eq!(Parser::detect(BLK, Filter::default()).unwrap().format(), Format::Blkparse);
    }

    #[test]
    fn the_generator_matches_the_paper_shape_and_refuses_nonsense() {
        let r: Vec<Request> = emc_tel(20_000, 333.0, 4, Shape::EMC_TEL).unwrap().collect();
        let writes = r.iter().filter(|q| q.write).count() as f64 / r.len() as f64;
        assert!((writes - 0.89).abs() < 0.01, "{writes}");
        let rate = r.len() as f64 / r[r.len() - 1].at;
        assert!((rate - 333.0).abs() < 10.0, "{rate}");
        let again: Vec<Request> = emc_tel(20_000, 333.0, 4, Shape::EMC_TEL).unwrap().collect();
        assert_eq!(r, again);
        assert!(emc_tel(1, 0.0, 4, Shape::EMC_TEL).is_err());
        assert!(emc_tel(1, f64::NAN, 4, Shape::EMC_TEL).is_err());
        assert!(emc_tel(1, 1.0, 4, Shape { size: 4096, write_pct: 50, span: 2048 }).is_err());
        assert!(emc_tel(1, 1.0, 4, Shape { size: 0, write_pct: 50, span: 2048 }).is_err());
    }

    proptest! {
        #[test]
        fn generated_traces_are_sorted_and_within_the_span(
            n in 0u64..2000, rate in 0.01f64..1e6, seed: u64,
            size in 1u64..65536, slots in 1u64..100_000, pct in 0u32..=100,
        ) {
            let shape = Shape { size, write_pct: pct, span: size * slots + size / 2 };
            let mut last = 0.0;
            let mut count = 0;
            for q in emc_tel(n, rate, seed, shape).unwrap() {
                prop_assert!(q.at >= last && q.at.is_finite());
                prop_assert!(q.offset % size == 0 && q.offset + q.len <= shape.span && q.len == size);
                last = q.at;
                count += 1;
            }
            prop_assert_eq!(count, n);
        }

        #[test]
        fn parsers_never_panic(text in proptest::collection::vec(any::<u8>(), 0..400)) {
            for f in [Format::Msr, Format::Blkparse] {
                for q in Parser::new(&text[..], f, Filter::default()).flatten() {
                    prop_assert!(q.at >= 0.0 && q.offset.checked_add(q.len).is_some());
                }
            }
        }
    }
}
