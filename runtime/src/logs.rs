//! Log lines of both binaries (`--log-format`), plain text or JSON: `tracing_subscriber`'s layouts written by holdfast's own
//! formatter. The per-admission line is on the hot path, and the stock formatters pay for
//! generality there (every field through `Debug` and padding checks, JSON fields collected into
//! a map of `serde_json::Value`s and then serialised) — about three times this formatter's cost.
//!
//! - **plain**: `2026-11-30T09:50:01.123456Z  INFO span{k=v}: target: message k=v k=v` — a
//!   string value is written bare when it has no space, quote, `=` or control character, quoted
//!   (Rust escapes) otherwise.
//! - **json**: `{"timestamp":"…","level":"INFO","fields":{"message":"…","k":"v"},"target":"…"}`,
//!   plus `"spans":[{"name":"…","k":"v"}]` (root first) inside spans; numbers and booleans stay
//!   JSON numbers and booleans, anything else is a string.

use std::{
    fmt::{self, Write as _},
    marker::PhantomData,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{
    EnvFilter,
    field::RecordFields,
    fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter, format::Writer},
    registry::LookupSpan,
};

/// `--log-format`, shared by `holdfast-webhook` and `holdfast-controller`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

/// Installs the process's subscriber: `format` lines on stdout, level from `RUST_LOG` (default
/// `info`), colour only for a terminal (in a pod escape codes would end up in collected logs).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    if tracing::subscriber::set_global_default(subscriber(format, filter, ansi, std::io::stdout)).is_err() {
        eprintln!("a tracing subscriber was already installed; keeping it");
    }
}

/// A subscriber writing `format` lines to `writer`, filtered by `filter`; `ansi` colours the
/// level (plain text only: for a terminal, never for collected logs).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Plain => Box::new(
            builder
                .fmt_fields(PlainFields)
                .event_format(PlainLine { ansi })
                .finish(),
        ),
        LogFormat::Json => Box::new(builder.fmt_fields(JsonFields).event_format(JsonLine).finish()),
    }
}

/// Fields as `k=v k=v`; a `message` field is written bare, without its name.
pub struct PlainFields;

impl<'w> FormatFields<'w> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        write_fields::<Self>(writer, true, fields)
    }
}

impl Layout for PlainFields {
    const SEPARATOR: char = ' ';

    fn name(writer: &mut Writer<'_>, field: &Field) -> fmt::Result {
        if field.name() == "message" {
            return Ok(());
        }
        writer.write_str(field.name())?;
        writer.write_char('=')
    }

    fn string(writer: &mut Writer<'_>, field: &Field, value: &str) -> fmt::Result {
        if field.name() == "message" || is_bare(value) {
            writer.write_str(value)
        } else {
            write!(writer, "{value:?}")
        }
    }

    fn text(writer: &mut Writer<'_>, value: fmt::Arguments<'_>) -> fmt::Result {
        writer.write_fmt(value)
    }
}

/// How a layout writes fields: what separates them, the name before a value, string values, and
/// any other value's `Display` or `Debug` output (numbers and booleans are written as such).
trait Layout {
    const SEPARATOR: char;
    fn name(writer: &mut Writer<'_>, field: &Field) -> fmt::Result;
    fn string(writer: &mut Writer<'_>, field: &Field, value: &str) -> fmt::Result;
    fn text(writer: &mut Writer<'_>, value: fmt::Arguments<'_>) -> fmt::Result;
}

/// Records `fields` in `L`'s layout; `first`: no separator before the first one.
fn write_fields<L: Layout>(mut writer: Writer<'_>, first: bool, fields: impl RecordFields) -> fmt::Result {
    let mut visitor = FieldWriter::<L> {
        writer: &mut writer,
        first,
        result: Ok(()),
        layout: PhantomData,
    };
    fields.record(&mut visitor);
    visitor.result
}

struct FieldWriter<'a, 'w, L> {
    writer: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
    layout: PhantomData<L>,
}

impl<L: Layout> FieldWriter<'_, '_, L> {
    /// Writes the separator and the name, then the value; after an error, nothing more.
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        self.result = (|| {
            if !self.first {
                self.writer.write_char(L::SEPARATOR)?;
            }
            self.first = false;
            L::name(self.writer, field)?;
            value(self.writer)
        })();
    }
}

impl<L: Layout> Visit for FieldWriter<'_, '_, L> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, |w| L::string(w, field, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinities: those go as text.
        self.field(field, |w| {
            if value.is_finite() {
                write!(w, "{value}")
            } else {
                L::text(w, format_args!("{value}"))
            }
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |w| w.write_str(if value { "true" } else { "false" }));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.field(field, |w| L::text(w, format_args!("{value}")));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |w| L::text(w, format_args!("{value:?}")));
    }
}

/// Whether `value` reads unambiguously without quotes in a `k=v k=v` line.
fn is_bare(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b > b' ' && b != b'"' && b != b'=' && b != b'\\' && b != 0x7f)
}

/// `timestamp LEVEL spans: target: fields`, as `tracing_subscriber`'s default (full) format.
pub struct PlainLine {
    ansi: bool,
}

impl<S, N> FormatEvent<S, N> for PlainLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        timestamp(&mut writer, SystemTime::now())?;
        let level = level_name(event.metadata().level());
        if self.ansi {
            write!(
                writer,
                " {}{level:>5}\x1b[0m ",
                level_colour(event.metadata().level())
            )?;
        } else {
            write!(writer, " {level:>5} ")?;
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                writer.write_str(span.name())?;
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, "{{{fields}}}")?;
                }
                writer.write_char(':')?;
            }
            writer.write_char(' ')?;
        }
        writer.write_str(event.metadata().target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// `now` as RFC 3339 in UTC with microseconds (`2026-11-30T09:50:01.123456Z`), as
/// `tracing_subscriber`'s default timer writes it, from digits rather than through padded
/// `Display` formatting, which cost a third of the whole line.
fn timestamp(writer: &mut Writer<'_>, now: SystemTime) -> fmt::Result {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let seconds = since.as_secs();
    let (year, month, day) = civil_date(seconds / 86_400);
    let time_of_day = seconds % 86_400;
    let mut out = *b"0000-00-00T00:00:00.000000Z";
    digits(&mut out[0..4], year);
    digits(&mut out[5..7], month);
    digits(&mut out[8..10], day);
    digits(&mut out[11..13], time_of_day / 3600);
    digits(&mut out[14..16], time_of_day / 60 % 60);
    digits(&mut out[17..19], time_of_day % 60);
    digits(&mut out[20..26], u64::from(since.subsec_micros()));
    // Only ASCII digits and separators were written.
    writer.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
}

/// Writes `value`'s last `out.len()` decimal digits into `out`.
fn digits(out: &mut [u8], mut value: u64) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Year, month and day of the `days`-th day after 1970-01-01 (proleptic Gregorian calendar;
/// Howard Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

fn level_colour(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "\x1b[31m",
        Level::WARN => "\x1b[33m",
        Level::INFO => "\x1b[32m",
        Level::DEBUG => "\x1b[34m",
        Level::TRACE => "\x1b[35m",
    }
}

/// Fields as the members of a JSON object, `"k":v,"k":v` (no braces).
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        write_fields::<Self>(writer, true, fields)
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let first = current.is_empty();
        write_fields::<Self>(current.as_writer(), first, fields)
    }
}

impl Layout for JsonFields {
    const SEPARATOR: char = ',';

    fn name(writer: &mut Writer<'_>, field: &Field) -> fmt::Result {
        json_string(writer, field.name())?;
        writer.write_char(':')
    }

    fn string(writer: &mut Writer<'_>, _: &Field, value: &str) -> fmt::Result {
        json_string(writer, value)
    }

    fn text(writer: &mut Writer<'_>, value: fmt::Arguments<'_>) -> fmt::Result {
        json_display(writer, value)
    }
}

/// `{"timestamp":…,"level":…,"fields":{…},"target":…,"spans":[…]}`, the members in the order
/// of `tracing_subscriber`'s JSON format.
pub struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str("{\"timestamp\":\"")?;
        timestamp(&mut writer, SystemTime::now())?;
        write!(
            writer,
            "\",\"level\":\"{}\",\"fields\":{{",
            level_name(event.metadata().level())
        )?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_str("},\"target\":")?;
        json_string(&mut writer, event.metadata().target())?;
        if let Some(scope) = ctx.event_scope() {
            writer.write_str(",\"spans\":[")?;
            for (i, span) in scope.from_root().enumerate() {
                if i > 0 {
                    writer.write_char(',')?;
                }
                writer.write_str("{\"name\":")?;
                json_string(&mut writer, span.name())?;
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, ",{fields}")?;
                }
                writer.write_char('}')?;
            }
            writer.write_char(']')?;
        }
        writer.write_str("}\n")
    }
}

/// `value` as a JSON string literal.
fn json_string(writer: &mut Writer<'_>, value: &str) -> fmt::Result {
    writer.write_char('"')?;
    JsonEscape(writer).write_str(value)?;
    writer.write_char('"')
}

/// Formatted output as a JSON string literal, escaped as it is written (no buffer).
fn json_display(writer: &mut Writer<'_>, value: fmt::Arguments<'_>) -> fmt::Result {
    writer.write_char('"')?;
    JsonEscape(writer).write_fmt(value)?;
    writer.write_char('"')
}

/// Escapes what JSON requires inside a string: quote, backslash and control characters.
struct JsonEscape<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for JsonEscape<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&s[start..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Captures what a subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(format: LogFormat, emit: impl FnOnce()) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = subscriber(format, EnvFilter::new("debug"), false, move || writer.clone());
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    fn admission_line() {
        tracing::info!(
            uid = "0c9a8d74",
            namespace = "",
            name = "has space",
            quote = "say \"hi\"\n",
            count = 3u64,
            delta = -2i64,
            dry_run = false,
            shown = %"display",
            debugged = ?Some(1),
            "admission"
        );
    }

    #[test]
    fn plain_lines_read_as_key_value_pairs_quoting_only_what_needs_it() {
        let out = lines(LogFormat::Plain, admission_line);
        let (time, rest) = out.split_once(' ').unwrap();
        assert!(time.ends_with('Z') && time.contains('T'), "{out}");
        assert_eq!(
            rest,
            " INFO holdfast_runtime::logs::tests: admission uid=0c9a8d74 namespace=\"\" name=\"has space\" \
             quote=\"say \\\"hi\\\"\\n\" count=3 delta=-2 dry_run=false shown=display debugged=Some(1)\n"
        );
    }

    #[test]
    fn json_lines_parse_with_typed_fields() {
        let out = lines(LogFormat::Json, admission_line);
        let line: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["target"], "holdfast_runtime::logs::tests");
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(
            line["fields"],
            serde_json::json!({
                "message": "admission", "uid": "0c9a8d74", "namespace": "", "name": "has space",
                "quote": "say \"hi\"\n", "count": 3, "delta": -2, "dry_run": false,
                "shown": "display", "debugged": "Some(1)"
            })
        );
        assert!(line.get("spans").is_none());
    }

    #[test]
    fn timestamps_match_the_calendar() {
        let format = time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
        );
        // Epoch, leap days, century rules (2000 is a leap year, 2100 is not), year ends.
        let mut instants = vec![
            0,
            951_782_400,
            951_868_799,
            1_709_164_800,
            4_107_542_399,
            4_107_628_800,
        ];
        instants.extend((0..2_000u64).map(|i| i * 1_234_567 + 86_399));
        for seconds in instants {
            let at = UNIX_EPOCH + Duration::new(seconds, 123_456_789);
            let mut ours = String::new();
            timestamp(&mut Writer::new(&mut ours), at).unwrap();
            let theirs = time::OffsetDateTime::from(at).format(&format).unwrap();
            assert_eq!(ours, theirs, "{seconds}");
        }
    }

    #[test]
    fn floats_are_numbers_and_non_finite_ones_text() {
        let emit = || tracing::info!(ratio = 0.5f64, none = f64::NAN, "f");
        assert!(lines(LogFormat::Plain, emit).ends_with(": f ratio=0.5 none=NaN\n"));
        let json: serde_json::Value = serde_json::from_str(&lines(LogFormat::Json, emit)).unwrap();
        assert_eq!(
            json["fields"],
            serde_json::json!({"message": "f", "ratio": 0.5, "none": "NaN"})
        );
    }

    #[test]
    fn control_characters_are_escaped_in_json() {
        let out = lines(LogFormat::Json, || tracing::warn!(raw = "a\u{1}b\tc\\", "x"));
        let line: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(line["fields"]["raw"], "a\u{1}b\tc\\");
        assert!(out.contains(r#""a\u0001b\tc\\""#), "{out}");
    }

    #[test]
    fn spans_are_written_root_first_in_both_formats() {
        let emit = || {
            let outer = tracing::info_span!("resolve", registry = "r.example");
            let _outer = outer.enter();
            let inner = tracing::debug_span!("fetch");
            let _inner = inner.enter();
            tracing::error!(status = 429u64, "refused");
        };
        let plain = lines(LogFormat::Plain, emit);
        assert!(
            plain.contains(
                " ERROR resolve{registry=r.example}:fetch: holdfast_runtime::logs::tests: refused status=429\n"
            ),
            "{plain}"
        );
        let json: serde_json::Value = serde_json::from_str(&lines(LogFormat::Json, emit)).unwrap();
        assert_eq!(
            json["spans"],
            serde_json::json!([{"name": "resolve", "registry": "r.example"}, {"name": "fetch"}])
        );
        assert_eq!(
            json["fields"],
            serde_json::json!({"message": "refused", "status": 429})
        );
    }
}
