//! What an experiment returns and how it is written: tables on stdout (text, CSV or JSON), figures
//! as PNG, and with `--out` a folder holding the report in Markdown, every table as CSV and JSON,
//! the figures, the exact commands run and the machine's facts.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use stics_report::plot::{self, Figure};
use stics_report::{Format, Table};

use crate::machine::Machine;
use crate::Result;

/// One table of an experiment, with the figure drawn from it if there is one.
#[derive(Debug, Clone)]
pub struct Section {
    /// What the table shows, and which table or figure of which seed it reproduces.
    pub caption: String,
    pub table: Table,
    pub figure: Option<Figure>,
}

/// The result of one experiment.
#[derive(Debug, Clone)]
pub struct Report {
    /// The subcommand ("micro"), also the name of its folder under `--out`.
    pub name: String,
    /// "Seed 001 Figs. 1–2: …".
    pub title: String,
    pub sections: Vec<Section>,
    /// The reading of the results against the paper: where we agree, where we differ and why.
    pub notes: Vec<String>,
    /// Pass/fail statements for experiments that are also tests (conformance); a benchmark
    /// prints and does not judge, so most have none.
    pub checks: Vec<(String, bool)>,
    /// The command line that asked for the experiment and every command it ran, in order.
    pub commands: Vec<String>,
}

impl Report {
    pub fn new(name: &str, title: &str) -> Report {
        Report {
            name: name.to_owned(),
            title: title.to_owned(),
            sections: Vec::new(),
            notes: Vec::new(),
            checks: Vec::new(),
            commands: Vec::new(),
        }
    }

    pub fn section(&mut self, caption: impl Into<String>, table: Table, figure: Option<Figure>) {
        self.sections.push(Section { caption: caption.into(), table, figure });
    }

    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    pub fn check(&mut self, what: impl Into<String>, ok: bool) {
        self.checks.push((what.into(), ok));
    }

    /// The checks that failed.
    pub fn failed_checks(&self) -> Vec<&str> {
        self.checks.iter().filter(|(_, ok)| !ok).map(|(w, _)| w.as_str()).collect()
    }

    /// The report as stdout shows it in `format`.
    pub fn render(&self, format: Format) -> Result<String> {
        let mut out = String::new();
        match format {
            Format::Json => {
                let sections: Vec<serde_json::Value> = self
                    .sections
                    .iter()
                    .map(|s| serde_json::json!({ "caption": s.caption, "rows": s.table.rows_json() }))
                    .collect();
                let checks: Vec<serde_json::Value> =
                    self.checks.iter().map(|(w, ok)| serde_json::json!({ "check": w, "ok": ok })).collect();
                let v = serde_json::json!({
                    "experiment": self.name, "title": self.title, "sections": sections, "notes": self.notes,
                    "checks": checks,
                });
                out = serde_json::to_string_pretty(&v).map_err(stics_report::Error::from)? + "\n";
            }
            Format::Csv => {
                for (i, s) in self.sections.iter().enumerate() {
                    if i > 0 {
                        out.push('\n');
                    }
                    let _ = writeln!(out, "# {}", s.caption);
                    out.push_str(&s.table.csv());
                }
            }
            Format::Text => {
                let _ = writeln!(out, "{}\n", self.title);
                for s in &self.sections {
                    let _ = writeln!(out, "{}\n", s.caption);
                    out.push_str(&s.table.text());
                    out.push('\n');
                }
                for n in &self.notes {
                    let _ = writeln!(out, "- {n}");
                }
                for (w, ok) in &self.checks {
                    let _ = writeln!(out, "{} {w}", if *ok { "PASS" } else { "FAIL" });
                }
            }
        }
        Ok(out)
    }

    /// The report as Markdown, figures linked as `NAME-N.png` beside it.
    pub fn markdown(&self, level: usize) -> String {
        let h = "#".repeat(level);
        let mut out = format!("{h} {}\n\n", self.title);
        for (i, s) in self.sections.iter().enumerate() {
            let _ = writeln!(out, "{h}# {}\n", s.caption);
            out.push_str(&s.table.markdown());
            out.push('\n');
            if s.figure.is_some() {
                let _ = writeln!(out, "![{}]({})\n", s.caption, figure_name(&self.name, i));
            }
        }
        if !self.notes.is_empty() || !self.checks.is_empty() {
            let _ = writeln!(out, "{h}# Reading\n");
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
            for (w, ok) in &self.checks {
                let _ = writeln!(out, "- {}: {w}", if *ok { "pass" } else { "**FAIL**" });
            }
            out.push('\n');
        }
        out
    }

    /// Draws the figures: the first to `path`, the next ones beside it as `STEM-2.png`, ….
    pub fn plot(&self, path: &Path) -> Result<Vec<PathBuf>> {
        let mut drawn = Vec::new();
        for (n, fig) in self.sections.iter().filter_map(|s| s.figure.as_ref()).enumerate() {
            let p = if n == 0 {
                path.to_owned()
            } else {
                let stem = path.file_stem().map_or_else(|| "plot".into(), |s| s.to_string_lossy().into_owned());
                path.with_file_name(format!("{stem}-{}.png", n + 1))
            };
            plot::draw(fig, &p)?;
            drawn.push(p);
        }
        Ok(drawn)
    }

    /// Writes the report's folder `dir/NAME`: report.md, each table as CSV and JSON, the figures,
    /// commands.txt and machine.json.
    pub fn write(&self, dir: &Path, commands: &[String], machine: &Machine) -> Result<PathBuf> {
        let d = dir.join(&self.name);
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join("report.md"), self.markdown(1))?;
        for (i, s) in self.sections.iter().enumerate() {
            std::fs::write(d.join(format!("table-{}.csv", i + 1)), s.table.csv())?;
            let json = serde_json::to_string_pretty(&s.table.rows_json()).map_err(stics_report::Error::from)?;
            std::fs::write(d.join(format!("table-{}.json", i + 1)), json + "\n")?;
            if let Some(f) = &s.figure {
                plot::draw(f, &d.join(figure_name(&self.name, i)))?;
            }
        }
        let mut cmds = commands.join("\n");
        cmds.push('\n');
        std::fs::write(d.join("commands.txt"), cmds)?;
        std::fs::write(
            d.join("machine.json"),
            serde_json::to_string_pretty(machine).map_err(stics_report::Error::from)? + "\n",
        )?;
        Ok(d)
    }
}

/// The file name of section `i`'s figure.
pub fn figure_name(name: &str, i: usize) -> String {
    format!("{name}-{}.png", i + 1)
}

#[cfg(test)]
mod tests {
    use stics_report::Column;

    use super::*;

    fn sample() -> Report {
        let mut t = Table::new(vec![
            Column::new("size", "size", "KiB", 1.0 / 1024.0),
            Column::new("lat", "latency", "µs", 1e6),
        ])
        .unwrap();
        t.push(vec![4096.0.into(), 0.000_05.into()]).unwrap();
        t.push(vec![8192.0.into(), 0.000_07.into()]).unwrap();
        let mut r = Report::new("micro", "Seed 001: latency");
        r.section("QD1 reads", t, None);
        r.note("we agree");
        r
    }

    #[test]
    fn renders_text_csv_json_and_markdown() {
        let r = sample();
        let text = r.render(Format::Text).unwrap();
        assert!(text.contains("latency [µs]") && text.contains("- we agree"), "{text}");
        let csv = r.render(Format::Csv).unwrap();
        assert!(csv.starts_with("# QD1 reads\nsize,lat\n4096,"), "{csv}");
        let json: serde_json::Value = serde_json::from_str(&r.render(Format::Json).unwrap()).unwrap();
        assert_eq!(json["sections"][0]["rows"][1]["size"], 8192.0);
        let md = r.markdown(2);
        assert!(md.starts_with("## Seed 001") && md.contains("| 8 | 70 |"), "{md}");
    }

    #[test]
    fn a_table_of_one_row_is_still_an_array_of_rows() {
        let mut t = Table::new(vec![Column::new("size", "size", "KiB", 1.0 / 1024.0)]).unwrap();
        t.push(vec![4096.0.into()]).unwrap();
        let mut r = Report::new("postmark", "one slice");
        r.section("slice", t, None);
        let json: serde_json::Value = serde_json::from_str(&r.render(Format::Json).unwrap()).unwrap();
        assert_eq!(json["sections"][0]["rows"][0]["size"], 4096.0);
        let dir = tempfile::tempdir().unwrap();
        let d = r.write(dir.path(), &[], &Machine::default()).unwrap();
        let file = std::fs::read_to_string(d.join("table-1.json")).unwrap();
        assert_eq!(file, "[\n  {\n    \"size\": 4096.0\n  }\n]\n");
    }

    #[test]
    fn writes_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let r = sample();
        let d = r.write(dir.path(), &["stics target".into()], &Machine::default()).unwrap();
        for f in ["report.md", "table-1.csv", "table-1.json", "commands.txt", "machine.json"] {
            assert!(d.join(f).is_file(), "{f}");
        }
    }
}
