//! Every kind of plot comes out as a PNG (needs a TrueType font, as `stics model --plot` does).

use stics_report::plot::{draw, histogram, Figure, Series};

fn figure(series: Vec<Series>, log: bool) -> Figure {
    Figure {
        title: "kinds of plot".into(),
        x_label: "x [ms]".into(),
        y_label: "y [count]".into(),
        log_x: log,
        log_y: log,
        categories: Vec::new(),
        series,
    }
}

fn png(fig: &Figure) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fig.png");
    draw(fig, &path).unwrap();
    std::fs::read(&path).unwrap()
}

#[test]
fn lines_scatters_and_histograms_draw() {
    let samples: Vec<f64> = (0..500).map(|i| f64::from((i * 37) % 101) / 10.0).collect();
    let fig = figure(
        vec![
            Series::line("line", (1..=10).map(|x| (f64::from(x), f64::from(x * x))).collect()),
            Series::scatter("scatter", (1..=10).map(|x| (f64::from(x), 100.0 / f64::from(x))).collect()),
            Series::bars("histogram", histogram(&samples, 10)),
        ],
        false,
    );
    assert_eq!(&png(&fig)[..8], b"\x89PNG\r\n\x1a\n");
    let log = figure(vec![Series::bars("histogram", histogram(&samples, 10))], true);
    assert_eq!(&png(&log)[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn nothing_finite_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let fig = figure(vec![Series::line("empty", vec![(f64::NAN, 1.0)])], false);
    let err = draw(&fig, &dir.path().join("x.png")).unwrap_err();
    assert_eq!(err.to_string(), "plot: no finite points to draw");
}

#[test]
fn bars_in_categories_stand_side_by_side() {
    let mut fig = figure(
        vec![
            Series::bars("a", vec![(1.0, 10.0), (2.0, 1000.0), (3.0, 5.0)]),
            Series::bars("b", vec![(1.0, 20.0), (3.0, 50.0)]),
        ],
        false,
    );
    fig.log_x = false;
    fig.log_y = true;
    fig.categories = vec!["small".into(), "medium".into(), "large".into()];
    assert_eq!(&png(&fig)[..8], b"\x89PNG\r\n\x1a\n");
}
