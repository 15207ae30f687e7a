//! Tables of results: named columns with units, rows of numbers and text, rendered as an aligned
//! text table, CSV or JSON at once ([`Table`]) or row by row while they are measured ([`Stream`]).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Write;

use serde_json::{Map, Value};

use crate::sweep::Point;
use crate::{fmt, Error, Result};

/// How a table is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns with `heading [unit]` headers, values in display units, four significant
    /// digits; a single row prints as `heading value` lines.
    Text,
    /// A header row of keys, then one line per row in base units.
    Csv,
    /// Objects keyed by column key, in base units: one object for one row, else an array
    /// ([`Table::rows_json`] is always an array).
    Json,
}

/// A column: its key (CSV header, JSON key; values in SI base units), heading, display unit and
/// the factor from base to display unit. A ratio column is computed from two others.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    key: Cow<'static, str>,
    head: Cow<'static, str>,
    unit: Cow<'static, str>,
    scale: f64,
    width: usize,
    ratio: Option<(Cow<'static, str>, Cow<'static, str>)>,
}

impl Column {
    /// A column of `key` headed `head [unit]`, whose text shows `value · scale`.
    pub const fn new(key: &'static str, head: &'static str, unit: &'static str, scale: f64) -> Column {
        Column {
            key: Cow::Borrowed(key),
            head: Cow::Borrowed(head),
            unit: Cow::Borrowed(unit),
            scale,
            width: 0,
            ratio: None,
        }
    }

    /// Like [`Column::new`], with names made at run time.
    pub fn named(
        key: impl Into<Cow<'static, str>>,
        head: impl Into<Cow<'static, str>>,
        unit: impl Into<Cow<'static, str>>,
        scale: f64,
    ) -> Column {
        Column { key: key.into(), head: head.into(), unit: unit.into(), scale, width: 0, ratio: None }
    }

    /// `numerator / denominator`, filled in when a row is pushed (the row gives no cell for it);
    /// missing when either is text or missing.
    pub fn ratio(
        key: impl Into<Cow<'static, str>>,
        head: impl Into<Cow<'static, str>>,
        numerator: impl Into<Cow<'static, str>>,
        denominator: impl Into<Cow<'static, str>>,
    ) -> Column {
        Column { ratio: Some((numerator.into(), denominator.into())), ..Column::named(key, head, "", 1.0) }
    }

    /// The three columns of a comparison with a published number: `STEM_paper` ("paper"),
    /// `STEM_ours` ("ours") in `unit`, and their ratio `STEM_ratio` ("ours/paper").
    pub fn paper_and_ours(stem: &str, unit: impl Into<Cow<'static, str>>, scale: f64) -> [Column; 3] {
        let unit = unit.into();
        let (paper, ours) = (format!("{stem}_paper"), format!("{stem}_ours"));
        [
            Column::named(paper.clone(), "paper", unit.clone(), scale),
            Column::named(ours.clone(), "ours", unit, scale),
            Column::ratio(format!("{stem}_ratio"), "ours/paper", ours, paper),
        ]
    }

    /// The narrowest this column prints in a [`Stream`], which cannot see later rows.
    pub fn min_width(mut self, width: usize) -> Column {
        self.width = width;
        self
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn head(&self) -> &str {
        &self.head
    }

    pub fn unit(&self) -> &str {
        &self.unit
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// True for a column the table computes ([`Column::ratio`]).
    pub fn is_derived(&self) -> bool {
        self.ratio.is_some()
    }

    /// `head [unit]`, or `head` without a unit.
    pub fn heading(&self) -> String {
        if self.unit.is_empty() {
            self.head.to_string()
        } else {
            format!("{} [{}]", self.head, self.unit)
        }
    }

    /// The cell as the text table shows it.
    fn show(&self, cell: &Cell) -> String {
        match cell {
            Cell::Num(x) => fmt::num(x * self.scale),
            Cell::Text(t) => t.clone(),
        }
    }
}

/// One value: a number in the column's base unit (NaN for missing), or text.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Num(f64),
    Text(String),
}

impl From<f64> for Cell {
    fn from(v: f64) -> Cell {
        Cell::Num(v)
    }
}

impl From<&str> for Cell {
    fn from(v: &str) -> Cell {
        Cell::Text(v.to_string())
    }
}

impl From<String> for Cell {
    fn from(v: String) -> Cell {
        Cell::Text(v)
    }
}

impl Cell {
    fn json(&self) -> Value {
        match self {
            Cell::Num(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
            Cell::Text(s) => Value::String(s.clone()),
        }
    }

    fn csv(&self) -> String {
        match self {
            Cell::Num(x) if x.is_nan() => String::new(),
            Cell::Num(x) => format!("{x}"),
            Cell::Text(t) => csv_field(t),
        }
    }
}

/// Quotes a CSV field that holds a comma, a quote or a line break (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A row: one cell per column, and the tags (`name=value` of the parameters that vary between
/// curves) that a chart uses to group rows into curves.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    cells: Vec<Cell>,
    tags: Vec<(String, String)>,
}

impl Row {
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    pub fn tags(&self) -> &[(String, String)] {
        &self.tags
    }
}

/// Columns and the rows pushed so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Row>,
    /// For each ratio column: its index, and the indices of its numerator and denominator.
    ratios: Vec<(usize, usize, usize)>,
}

impl Table {
    /// A table of these columns; a ratio column must name two columns that are not ratios.
    pub fn new(columns: Vec<Column>) -> Result<Table> {
        let find = |key: &str| {
            columns.iter().position(|c| c.key == key && !c.is_derived()).ok_or_else(|| Error::NoColumn(key.to_string()))
        };
        let mut ratios = Vec::new();
        for (i, c) in columns.iter().enumerate() {
            if let Some((num, den)) = &c.ratio {
                ratios.push((i, find(num)?, find(den)?));
            }
        }
        Ok(Table { columns, rows: Vec::new(), ratios })
    }

    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The index of the column `key`.
    pub fn column(&self, key: &str) -> Result<usize> {
        self.columns.iter().position(|c| c.key == key).ok_or_else(|| Error::NoColumn(key.to_string()))
    }

    /// Adds a row: one cell for each column that is not a ratio, in column order.
    pub fn push(&mut self, cells: Vec<Cell>) -> Result<()> {
        self.push_tagged(Vec::new(), cells)
    }

    /// Adds the row computed at a grid point, tagged with the point's curve labels.
    pub fn push_at(&mut self, point: &Point, cells: Vec<Cell>) -> Result<()> {
        self.push_tagged(point.tags().to_vec(), cells)
    }

    /// Adds a row with tags that group it into a chart's curves.
    pub fn push_tagged(&mut self, tags: Vec<(String, String)>, cells: Vec<Cell>) -> Result<()> {
        let want = self.columns.len() - self.ratios.len();
        if cells.len() != want {
            return Err(Error::RowLength { got: cells.len(), want });
        }
        let mut given = cells.into_iter();
        let mut row: Vec<Cell> = self
            .columns
            .iter()
            .map(|c| if c.is_derived() { Cell::Num(f64::NAN) } else { given.next().unwrap_or(Cell::Num(f64::NAN)) })
            .collect();
        for &(i, num, den) in &self.ratios {
            if let (Cell::Num(a), Cell::Num(b)) = (&row[num], &row[den]) {
                row[i] = Cell::Num(a / b);
            }
        }
        self.rows.push(Row { cells: row, tags });
        Ok(())
    }

    fn object(&self, row: &Row) -> Value {
        let mut m = Map::new();
        for (c, cell) in self.columns.iter().zip(&row.cells) {
            m.insert(c.key.to_string(), cell.json());
        }
        Value::Object(m)
    }

    /// The rows as JSON: one object for one row, else an array of objects. This is the shape of
    /// an answer (`stics model`), where one question gives one result; see [`Table::rows_json`].
    pub fn json(&self) -> Value {
        match self.rows_json() {
            Value::Array(mut objs) if objs.len() == 1 => objs.swap_remove(0),
            many => many,
        }
    }

    /// The rows as a JSON array of objects, whatever their number: the shape of a sweep, whose
    /// row count depends on its flags and whose readers should not have to care.
    pub fn rows_json(&self) -> Value {
        Value::Array(self.rows.iter().map(|r| self.object(r)).collect())
    }

    fn csv_header(&self) -> String {
        let mut s = self.columns.iter().map(|c| csv_field(&c.key)).collect::<Vec<_>>().join(",");
        s.push('\n');
        s
    }

    fn csv_row(row: &Row) -> String {
        let mut s = row.cells.iter().map(Cell::csv).collect::<Vec<_>>().join(",");
        s.push('\n');
        s
    }

    /// The table as CSV: keys, then the rows in base units (an empty field for a missing value).
    pub fn csv(&self) -> String {
        let mut s = self.csv_header();
        for row in &self.rows {
            s.push_str(&Self::csv_row(row));
        }
        s
    }

    /// The table as aligned text in display units.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if let [row] = self.rows.as_slice() {
            let width = self.columns.iter().map(|c| c.heading().chars().count()).max().unwrap_or(0);
            for (c, cell) in self.columns.iter().zip(&row.cells) {
                let _ = writeln!(out, "{:<width$}  {}", c.heading(), c.show(cell));
            }
            return out;
        }
        let cells: Vec<Vec<String>> =
            self.rows.iter().map(|r| self.columns.iter().zip(&r.cells).map(|(c, x)| c.show(x)).collect()).collect();
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                cells
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|s| s.chars().count())
                    .chain([c.heading().chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        out.push_str(&line(self.columns.iter().map(Column::heading), &widths));
        for r in cells {
            out.push_str(&line(r.into_iter(), &widths));
        }
        out
    }

    /// The table as a Markdown (GFM) table in display units, for reports.
    pub fn markdown(&self) -> String {
        let cell = |s: String| s.replace('|', "\\|");
        let mut out = String::new();
        let heads: Vec<String> = self.columns.iter().map(|c| cell(c.heading())).collect();
        let _ = writeln!(out, "| {} |", heads.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(heads.len()));
        for r in &self.rows {
            let cells: Vec<String> = self.columns.iter().zip(&r.cells).map(|(c, x)| cell(c.show(x))).collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        out
    }

    /// The table in `format`, ending in a newline.
    pub fn render(&self, format: Format) -> Result<String> {
        Ok(match format {
            Format::Text => self.text(),
            Format::Csv => self.csv(),
            Format::Json => serde_json::to_string_pretty(&self.json())? + "\n",
        })
    }
}

/// Right-aligns the items in their widths, two blanks apart, without trailing blanks.
fn line(items: impl Iterator<Item = String>, widths: &[usize]) -> String {
    items.zip(widths).map(|(s, w)| format!("{s:>w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string() + "\n"
}

/// A table printed row by row as the rows arrive, for measurements that take a while. Text
/// columns are as wide as their heading or [`Column::min_width`]; JSON is always an array.
pub struct Stream<W: Write> {
    table: Table,
    format: Format,
    out: W,
    widths: Vec<usize>,
}

impl<W: Write> Stream<W> {
    /// Starts the table and prints its header (text, CSV).
    pub fn new(columns: Vec<Column>, format: Format, out: W) -> Result<Stream<W>> {
        let table = Table::new(columns)?;
        let widths = table.columns.iter().map(|c| c.heading().chars().count().max(c.width)).collect();
        let mut s = Stream { table, format, out, widths };
        match format {
            Format::Text => {
                let head = line(s.table.columns.iter().map(Column::heading), &s.widths);
                s.out.write_all(head.as_bytes())?;
            }
            Format::Csv => {
                let head = s.table.csv_header();
                s.out.write_all(head.as_bytes())?;
            }
            Format::Json => {}
        }
        s.out.flush()?;
        Ok(s)
    }

    /// Adds a row (one cell per column that is not a ratio) and prints it at once.
    pub fn push(&mut self, cells: Vec<Cell>) -> Result<()> {
        self.push_tagged(Vec::new(), cells)
    }

    /// Like [`Stream::push`], tagged with a grid point's curve labels.
    pub fn push_at(&mut self, point: &Point, cells: Vec<Cell>) -> Result<()> {
        self.push_tagged(point.tags().to_vec(), cells)
    }

    /// Like [`Stream::push`], with tags for a chart.
    pub fn push_tagged(&mut self, tags: Vec<(String, String)>, cells: Vec<Cell>) -> Result<()> {
        self.table.push_tagged(tags, cells)?;
        let n = self.table.rows.len();
        let row = &self.table.rows[n - 1];
        let text = match self.format {
            Format::Text => line(self.table.columns.iter().zip(&row.cells).map(|(c, x)| c.show(x)), &self.widths),
            Format::Csv => Table::csv_row(row),
            Format::Json => {
                let obj = serde_json::to_string_pretty(&self.table.object(row))?;
                let indented: Vec<String> = obj.lines().map(|l| format!("  {l}")).collect();
                format!("{}{}", if n == 1 { "[\n" } else { ",\n" }, indented.join("\n"))
            }
        };
        self.out.write_all(text.as_bytes())?;
        self.out.flush()?;
        Ok(())
    }

    /// The rows so far.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Ends the output (closes the JSON array) and returns the table, e.g. for a chart.
    pub fn finish(mut self) -> Result<Table> {
        if self.format == Format::Json {
            let end = if self.table.is_empty() { "[]\n" } else { "\n]\n" };
            self.out.write_all(end.as_bytes())?;
        }
        self.out.flush()?;
        Ok(self.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_shows_display_units_and_escapes_bars() {
        let mut t =
            Table::new(vec![Column::new("what", "what", "", 1.0), Column::new("t", "time", "ms", 1e3)]).unwrap();
        t.push(vec!["a|b".into(), 0.0125.into()]).unwrap();
        assert_eq!(t.markdown(), "| what | time [ms] |\n|---|---|\n| a\\|b | 12.5 |\n");
    }
}
