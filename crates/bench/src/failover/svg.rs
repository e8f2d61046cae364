//! The share plot: each member's share of the requests sent in each bin,
//! one line per member, with the kill and the restart marked.

use std::fmt::Write as _;

use super::analysis::{ShareBin, Timeline};
use crate::report::svg_canvas;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

pub fn share_plot(timeline: &Timeline, bins: &[ShareBin]) -> String {
    let length = timeline.length.as_secs_f64().max(1e-9);
    let x = |s: f64| LEFT + s / length * (WIDTH - LEFT - RIGHT);
    let y = |share: f64| HEIGHT - BOTTOM - share * (HEIGHT - TOP - BOTTOM);
    let mut svg = svg_canvas(WIDTH, HEIGHT);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">Share of requests per member (1 s bins): {} killed and restarted</text>"#,
        WIDTH / 2.0,
        timeline.victim
    );
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{right}" y1="{at:.1}" y2="{at:.1}" stroke="#ddd"/><text x="{label_x}" y="{label_y:.1}" text-anchor="end">{percent:.0} %</text>"##,
            right = WIDTH - RIGHT,
            at = y(tick),
            label_x = LEFT - 6.0,
            label_y = y(tick) + 4.0,
            percent = tick * 100.0
        );
    }
    let step = if length > 20.0 { 5.0 } else { 2.0 };
    let mut second = 0.0;
    while second <= length + 1e-9 {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{second:.0}</text>"#,
            x(second),
            HEIGHT - BOTTOM + 16.0
        );
        second += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds (when the request was sent)</text>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 12.0
    );
    for (label, at) in [
        ("kill", timeline.killed_at),
        ("restart", timeline.restarted_at),
    ] {
        let at = x(at.as_secs_f64());
        let _ = writeln!(
            svg,
            r##"<line x1="{at:.1}" x2="{at:.1}" y1="{TOP}" y2="{}" stroke="#555" stroke-dasharray="5,4"/><text x="{:.1}" y="{}" >{label}</text>"##,
            HEIGHT - BOTTOM,
            at + 4.0,
            TOP + 12.0
        );
    }
    for (i, member) in timeline.members.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = bins
            .iter()
            .filter_map(|b| {
                let share = b.share(member)?;
                let middle = (b.start_s + 0.5).min(length);
                Some(format!("{:.1},{:.1}", x(middle), y(share)))
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            points.join(" ")
        );
        let legend_x = WIDTH - RIGHT - 70.0;
        let legend_y = TOP + 14.0 + i as f64 * 16.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x}" x2="{}" y1="{legend_y}" y2="{legend_y}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{member}</text>"#,
            legend_x + 20.0,
            legend_x + 26.0,
            legend_y + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_line_per_member_and_both_marks() {
        let timeline = Timeline {
            members: vec!["m0".into(), "m1".into()],
            victim: "m1".into(),
            killed_at: Duration::from_secs(1),
            restarted_at: Duration::from_secs(2),
            length: Duration::from_secs(3),
            unhealthy_after: Duration::from_secs(1),
        };
        let bins: Vec<ShareBin> = (0..3)
            .map(|i| ShareBin {
                start_s: i as f64,
                answered: [("m0".to_owned(), 1), ("m1".to_owned(), 1)].into(),
            })
            .collect();
        let svg = share_plot(&timeline, &bins);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">kill<") && svg.contains(">restart<"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
