//! Golden renderings of tables: the exact text, CSV and JSON that `stics model` and the benchmarks print.

use stics_report::plot::histogram;
use stics_report::{Axis, Cell, Chart, Column, Curve, Format, Grid, Mark, Stream, Table};

fn model_table() -> Table {
    let mut t = Table::new(vec![
        Column::new("rtt_s", "RTT", "ms", 1e3),
        Column::new("loss", "loss", "", 1.0),
        Column::new("throughput_bps", "B", "Mbit/s", 1e-6),
        Column::new("limit", "limit", "", 1.0),
    ])
    .unwrap();
    t.push(vec![Cell::Num(0.002), Cell::Num(1e-6), Cell::Num(262144000.0), "receive_window".into()]).unwrap();
    t.push(vec![Cell::Num(0.01), Cell::Num(1e-3), Cell::Num(34345678.9), "congestion_window".into()]).unwrap();
    t.push(vec![Cell::Num(f64::INFINITY), Cell::Num(0.5), Cell::Num(f64::NAN), "link".into()]).unwrap();
    t
}

#[test]
fn text_aligns_columns_right_in_display_units() {
    let want = concat!(
        "RTT [ms]      loss  B [Mbit/s]              limit\n",
        "       2  1.000e-6       262.1     receive_window\n",
        "      10     0.001       34.35  congestion_window\n",
        "     inf       0.5           -               link\n",
    );
    assert_eq!(model_table().text(), want);
    assert_eq!(model_table().render(Format::Text).unwrap(), want);
}

#[test]
fn one_row_prints_as_heading_value_lines() {
    let mut t =
        Table::new(vec![Column::new("rtt_s", "RTT", "ms", 1e3), Column::new("limit", "limit", "", 1.0)]).unwrap();
    t.push(vec![0.002.into(), "link".into()]).unwrap();
    assert_eq!(t.text(), "RTT [ms]  2\nlimit     link\n");
}

#[test]
fn no_rows_print_the_header_only() {
    let t = Table::new(vec![Column::new("a", "a", "s", 1.0)]).unwrap();
    assert_eq!(t.text(), "a [s]\n");
    assert_eq!(t.csv(), "a\n");
    assert_eq!(t.render(Format::Json).unwrap(), "[]\n");
}

#[test]
fn csv_keeps_base_units_and_leaves_missing_values_empty() {
    let want = "\
rtt_s,loss,throughput_bps,limit
0.002,0.000001,262144000,receive_window
0.01,0.001,34345678.9,congestion_window
inf,0.5,,link
";
    assert_eq!(model_table().csv(), want);
}

#[test]
fn csv_quotes_text_with_commas_and_quotes() {
    let mut t = Table::new(vec![Column::new("name", "name", "", 1.0)]).unwrap();
    t.push(vec!["4 KiB, depth 32".into()]).unwrap();
    t.push(vec!["say \"hi\"".into()]).unwrap();
    assert_eq!(t.csv(), "name\n\"4 KiB, depth 32\"\n\"say \"\"hi\"\"\"\n");
}

#[test]
fn json_is_an_array_of_objects_with_null_for_missing() {
    let want = r#"[
  {
    "limit": "receive_window",
    "loss": 1e-6,
    "rtt_s": 0.002,
    "throughput_bps": 262144000.0
  },
  {
    "limit": "congestion_window",
    "loss": 0.001,
    "rtt_s": 0.01,
    "throughput_bps": 34345678.9
  },
  {
    "limit": "link",
    "loss": 0.5,
    "rtt_s": null,
    "throughput_bps": null
  }
]
"#;
    assert_eq!(model_table().render(Format::Json).unwrap(), want);
}

#[test]
fn json_of_one_row_is_one_object() {
    let mut t = Table::new(vec![Column::new("a", "a", "", 1.0)]).unwrap();
    t.push(vec![1.5.into()]).unwrap();
    assert_eq!(t.render(Format::Json).unwrap(), "{\n  \"a\": 1.5\n}\n");
}

fn bench_columns() -> Vec<Column> {
    let mut cols = vec![Column::new("workload", "workload", "", 1.0)];
    cols.extend(Column::paper_and_ours("iops", "kIOPS", 1e-3));
    cols
}

#[test]
fn paper_and_ours_come_with_their_ratio() {
    let mut t = Table::new(bench_columns()).unwrap();
    t.push(vec!["4 KiB reads".into(), 45045.0.into(), 135227.0.into()]).unwrap();
    t.push(vec!["8 KiB writes".into(), 1000.0.into(), Cell::Num(f64::NAN)]).unwrap();
    let want = concat!(
        "    workload  paper [kIOPS]  ours [kIOPS]  ours/paper\n",
        " 4 KiB reads          45.05         135.2       3.002\n",
        "8 KiB writes              1             -           -\n",
    );
    assert_eq!(t.text(), want);
    assert_eq!(
        t.csv(),
        "workload,iops_paper,iops_ours,iops_ratio\n4 KiB reads,45045,135227,3.002042402042402\n8 KiB writes,1000,,\n"
    );
}

#[test]
fn a_row_must_fill_every_column_but_the_ratios() {
    let mut t = Table::new(bench_columns()).unwrap();
    let e = t.push(vec!["x".into(), 1.0.into(), 2.0.into(), 2.0.into()]).unwrap_err();
    assert_eq!(e.to_string(), "a row of 4 cells for a table that takes 3");
    assert!(Table::new(vec![Column::ratio("r", "r", "a", "b")]).is_err(), "a ratio needs its columns");
}

#[test]
fn a_stream_prints_each_row_as_it_comes() {
    let cols = || {
        let mut c = bench_columns();
        c[0] = Column::new("workload", "workload", "", 1.0).min_width(12);
        c
    };
    let mut s = Stream::new(cols(), Format::Text, Vec::new()).unwrap();
    s.push(vec!["4 KiB reads".into(), 45045.0.into(), 135227.0.into()]).unwrap();
    assert_eq!(s.table().len(), 1);
    let t = s.finish().unwrap();
    assert_eq!(t.len(), 1, "the table keeps the rows for a chart");

    let mut out = Vec::new();
    let mut s = Stream::new(cols(), Format::Text, &mut out).unwrap();
    s.push(vec!["4 KiB reads".into(), 45045.0.into(), 135227.0.into()]).unwrap();
    s.finish().unwrap();
    let want = concat!(
        "    workload  paper [kIOPS]  ours [kIOPS]  ours/paper\n",
        " 4 KiB reads          45.05         135.2       3.002\n",
    );
    assert_eq!(String::from_utf8(out).unwrap(), want);

    let mut out = Vec::new();
    let mut s = Stream::new(cols(), Format::Csv, &mut out).unwrap();
    s.push(vec!["a".into(), 2.0.into(), 3.0.into()]).unwrap();
    s.finish().unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), "workload,iops_paper,iops_ours,iops_ratio\na,2,3,1.5\n");
}

#[test]
fn a_json_stream_prints_what_the_table_prints_for_several_rows() {
    for rows in [0, 2, 3] {
        let mut out = Vec::new();
        let mut s = Stream::new(bench_columns(), Format::Json, &mut out).unwrap();
        for i in 0..rows {
            s.push(vec![format!("w{i}").into(), 1.0.into(), f64::from(i).into()]).unwrap();
        }
        let t = s.finish().unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), t.render(Format::Json).unwrap(), "{rows} rows");
    }
}

#[test]
fn a_chart_draws_one_series_per_tag_combination() {
    let show = |v: f64| format!("{v:e}");
    let mut grid = Grid::new(vec![
        Axis::new("loss", vec![1e-2, 1e-6], show),
        Axis::new("rtt", vec![1.0], show).sweepable(|s: &str| s.parse::<f64>()),
    ]);
    grid.sweep("rtt=1..3", 3, false).unwrap();
    let mut t =
        Table::new(vec![Column::new("rtt_s", "RTT", "ms", 1e3), Column::new("b", "B", "Mbit/s", 1e-6)]).unwrap();
    for p in grid.points().unwrap() {
        t.push_at(&p, vec![(p.get("rtt") * 1e-3).into(), (p.get("loss") * 1e8).into()]).unwrap();
    }
    let chart = Chart::new("B", "rtt_s", vec![Curve::new("b")]);
    let fig = chart.figure(&t).unwrap();
    assert_eq!(fig.x_label, "RTT [ms]");
    assert_eq!(fig.y_label, "B [Mbit/s]");
    let labels: Vec<&str> = fig.series.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels, ["loss=1e-2", "loss=1e-6"]);
    assert_eq!(fig.series[0].points, [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)]);

    let reference = Chart::new("B", "rtt_s", vec![Curve::new("b").prefix("all").skip(&["loss"]).mark(Mark::Points)]);
    let fig = reference.figure(&t).unwrap();
    assert_eq!(fig.series.len(), 1);
    assert_eq!(fig.series[0].label, "all");
    assert_eq!(fig.series[0].points.len(), 3, "one point per x when only skipped tags differ");
    assert_eq!(fig.series[0].mark, Mark::Points);
    assert!(Chart::new("x", "nope", vec![Curve::new("b")]).figure(&t).is_err());
}

#[test]
fn histograms_count_samples_in_equal_bins() {
    let h = histogram(&[0.0, 1.0, 1.0, 2.0, 4.0, f64::NAN], 4);
    assert_eq!(h, [(0.5, 1.0), (1.5, 2.0), (2.5, 1.0), (3.5, 1.0)]);
    assert!(histogram(&[], 4).is_empty());
    assert_eq!(histogram(&[3.0, 3.0], 2), [(3.5, 2.0), (4.5, 0.0)]);
}
