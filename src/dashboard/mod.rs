//! The analysts' dashboard: what it shows (`Dashboard::load`, from `storage::analytics` and
//! `storage::training_runs`, the same query code as the API and the CLI) and the server-rendered
//! HTML with inline SVG charts (`page`, no scripts, no front-end build). HTTP-free: the routes
//! in `api::routes::dashboard` authenticate, parse the filters and call these.

pub mod drift;
pub mod svg;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use chrono::NaiveDate;
use serde_json::Value;
use sqlx::PgPool;

use crate::recommend::ope::{self, LoggedDecision, TargetPolicy};
use crate::storage::StorageError;
use crate::storage::analytics::{
    self, AcceptanceCount, AcceptedOutcomes, ClusterName, DailyCount, GroupBy, Period, Scope,
};
use crate::storage::model_versions::{self, VersionSummary};
use crate::storage::rounds::{self, Round};
use crate::storage::training_runs::{self, RecordedRun};
use bandit::OpeReport;
use drift::DriftReport;
use svg::{Bar, Line};

/// A chart of the dashboard or a report: its data, so that it can be drawn as inline SVG (the
/// page, the report's HTML and `.svg` files) or as PNG (`arc-rec report`).
#[derive(Debug, Clone, PartialEq)]
pub enum Chart {
    /// Rates with intervals, one bar per group.
    Bars {
        /// File name without extension.
        stem: String,
        title: String,
        bars: Vec<Bar>,
        /// What the counts count (`shown`, `decisions`).
        noun: &'static str,
    },
    /// Rates over an x axis (days, steps), one line per series.
    Lines {
        stem: String,
        title: String,
        x: Vec<String>,
        lines: Vec<Line>,
    },
}

impl Chart {
    /// The chart as an inline SVG element.
    pub fn svg(&self) -> String {
        match self {
            Chart::Bars {
                title, bars, noun, ..
            } => svg::bar_chart(title, bars, noun),
            Chart::Lines {
                title, x, lines, ..
            } => svg::line_chart(title, x, lines),
        }
    }

    /// Its file name without extension.
    pub fn stem(&self) -> &str {
        match self {
            Chart::Bars { stem, .. } | Chart::Lines { stem, .. } => stem,
        }
    }

    /// Its title.
    pub fn title(&self) -> &str {
        match self {
            Chart::Bars { title, .. } | Chart::Lines { title, .. } => title,
        }
    }
}

/// How many of the newest logged decisions the off-policy estimates read (`GET
/// /v1/analytics/ope` reads up to `analytics::OPE_MAX_DECISIONS`): intervals of a few points,
/// within the page's budget of a second on any log size (on a million decisions, reading
/// 20,000 took 0.2–0.5 s and their three bootstraps 0.3 s).
pub const OPE_DECISIONS: i64 = 10_000;
/// Bootstrap resamples of each off-policy interval.
const OPE_RESAMPLES: usize = 200;
/// The alternative policies estimated, as `GET /v1/analytics/ope` names them.
const OPE_POLICIES: [(&str, TargetPolicy); 3] = [
    ("heuristic", TargetPolicy::Heuristic),
    ("lowest_cost", TargetPolicy::LowestCost),
    ("uniform", TargetPolicy::Uniform),
];

/// How the live policy's top recommendation fared and how alternatives would have.
#[derive(Debug, Clone)]
pub struct OffPolicy {
    /// The logged top recommendations read and how many were accepted.
    pub logged: AcceptanceCount,
    /// Per alternative policy (its API name), the estimate or why there is none.
    pub estimates: Vec<(&'static str, Result<OpeReport, String>)>,
}

impl OffPolicy {
    /// Estimates every alternative on the newest logged decisions (`None`: none logged).
    pub fn estimate(log: &[LoggedDecision]) -> Option<Self> {
        if log.is_empty() {
            return None;
        }
        let config = bandit::BootstrapConfig {
            resamples: OPE_RESAMPLES,
            level: 0.95,
            seed: 1,
        };
        let accepted = log.iter().filter(|d| d.accepted).count();
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        Some(Self {
            logged: AcceptanceCount {
                key: "logged (the live policy)".to_owned(),
                shown: count(log.len()),
                accepted: count(accepted),
            },
            // One thread per policy: the bootstraps are independent.
            estimates: std::thread::scope(|scope| {
                let handles: Vec<_> = OPE_POLICIES
                    .iter()
                    .map(|&(name, target)| {
                        let config = &config;
                        scope.spawn(move || {
                            (
                                name,
                                ope::evaluate(log, target, config).map_err(|e| e.to_string()),
                            )
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .zip(OPE_POLICIES)
                    .map(|(handle, (name, _))| {
                        handle.join().unwrap_or_else(|_| {
                            (name, Err("the estimate's thread panicked".to_owned()))
                        })
                    })
                    .collect()
            }),
        })
    }
}

/// How many of the newest training runs the dashboard lists (and draws the first few of).
pub const RUNS_LISTED: i64 = 10;
/// How many runs get their RL curve drawn.
const RUN_CURVES: usize = 3;

/// What an analyst chose to look at: a period and optionally one failure cluster of the key's
/// organization.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    pub period: Period,
    pub cluster: Option<String>,
}

/// Everything one dashboard page shows, for one organization.
#[derive(Debug, Clone)]
pub struct Dashboard {
    pub org: String,
    pub filters: Filters,
    /// The clusters the organization's counted decisions fall in (the cluster filter's choices).
    pub clusters: Vec<ClusterName>,
    /// Acceptance per day and policy version.
    pub by_day_and_policy: Vec<DailyCount>,
    pub by_source: Vec<AcceptanceCount>,
    pub by_cluster: Vec<AcceptanceCount>,
    pub by_type: Vec<AcceptanceCount>,
    pub by_provider: Vec<AcceptanceCount>,
    pub outcomes_by_source: Vec<AcceptedOutcomes>,
    pub outcomes_by_type: Vec<AcceptedOutcomes>,
    pub runs: Vec<RecordedRun>,
    /// Learning rounds (`arc-rec round`), newest first, and every model version with what it
    /// served: acceptance by round and version.
    pub rounds: Vec<Round>,
    pub versions: Vec<VersionSummary>,
    /// Off-policy estimates on the newest [`OPE_DECISIONS`] decisions in scope.
    pub off_policy: Option<OffPolicy>,
}

impl Dashboard {
    /// Reads the page's figures for `org` (`None`: every organization's together, for
    /// operators' reports), all queries at once, on `pool`.
    pub async fn load(
        pool: &PgPool,
        org: Option<&str>,
        filters: Filters,
    ) -> Result<Self, StorageError> {
        let scope = Scope {
            org,
            period: filters.period,
            cluster: filters.cluster.as_deref(),
        };
        let (clusters, by_day_and_policy, by_source, by_cluster, by_type, by_provider) = tokio::try_join!(
            analytics::counted_clusters(pool, org),
            analytics::acceptance_by_day(pool, scope, GroupBy::PolicyVersion),
            analytics::acceptance(pool, scope, GroupBy::Source),
            analytics::acceptance(pool, scope, GroupBy::Cluster),
            analytics::acceptance(pool, scope, GroupBy::Type),
            analytics::acceptance(pool, scope, GroupBy::Provider),
        )?;
        let (outcomes_by_source, outcomes_by_type, runs, tops, rounds, versions) = tokio::try_join!(
            analytics::accepted_outcomes(pool, scope, GroupBy::Source),
            analytics::accepted_outcomes(pool, scope, GroupBy::Type),
            training_runs::recent_runs(pool, org, RUNS_LISTED),
            analytics::logged_tops(pool, scope, OPE_DECISIONS),
            rounds::list(pool, org),
            model_versions::list(pool, org),
        )?;
        // The bootstraps are CPU work: off the request's thread.
        let off_policy =
            tokio::task::spawn_blocking(move || OffPolicy::estimate(&ope::decisions_of(tops)))
                .await
                .unwrap_or_else(|error| {
                    tracing::error!(%error, "the dashboard's off-policy estimates failed");
                    None
                });
        Ok(Self {
            org: org.map_or_else(|| "all organizations".to_owned(), str::to_owned),
            filters,
            clusters,
            by_day_and_policy,
            by_source,
            by_cluster,
            by_type,
            by_provider,
            outcomes_by_source,
            outcomes_by_type,
            runs,
            rounds,
            versions,
            off_policy,
        })
    }

    /// Shown and accepted over everything in scope (every grouping sums to it).
    pub fn total(&self) -> AcceptanceCount {
        AcceptanceCount {
            key: "all".to_owned(),
            shown: self.by_type.iter().map(|c| c.shown).sum(),
            accepted: self.by_type.iter().map(|c| c.accepted).sum(),
        }
    }

    /// A cluster's name as the dashboard writes it: its id, and its label where known.
    fn cluster_name(&self, id: &str) -> String {
        match self.clusters.iter().find(|c| c.cluster_id == id) {
            Some(ClusterName {
                label: Some(label), ..
            }) if label != id => format!("{id} ({label})"),
            _ => id.to_owned(),
        }
    }
}

/// HTML-escapes text for an element's content or a quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em auto;max-width:1560px;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}\
.grid{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}.chart{background:#fafafa;border:1px solid #eee}\
table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\
td:first-child,th:first-child{text-align:left}form.filters{background:#f4f4f4;padding:8px;display:flex;gap:12px;align-items:end;flex-wrap:wrap}\
form.filters label{display:flex;flex-direction:column;font-size:0.85em}.note{color:#555;font-size:0.9em}\
.headline{font-size:1.1em}.error{color:#a00}";

fn document(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>{}</title><style>{STYLE}</style></head><body>{body}</body></html>",
        escape(title)
    )
}

/// The login form: an analyst or admin key, kept by the browser in an HttpOnly cookie.
pub fn login_page(error: Option<&str>) -> String {
    let error = error.map_or(String::new(), |e| {
        format!("<p class=\"error\" role=\"alert\">{}</p>", escape(e))
    });
    document(
        "arc-rec dashboard: sign in",
        &format!(
            "<h1>arc-rec dashboard</h1>{error}<form method=\"post\" action=\"/dashboard/login\">\
             <label>API key (analyst or admin)<br><input type=\"password\" name=\"key\" autocomplete=\"current-password\" size=\"60\" required></label> \
             <button type=\"submit\">Sign in</button></form>\
             <p class=\"note\">The key is kept in an HttpOnly cookie for this browser session; sign out from the dashboard.</p>"
        ),
    )
}

/// A page for an error the browser should read (a bad filter, a key without the permission).
pub fn error_page(title: &str, message: &str) -> String {
    document(
        title,
        &format!(
            "<h1>{}</h1><p class=\"error\" role=\"alert\">{}</p><p><a href=\"/dashboard\">Back to the dashboard</a></p>",
            escape(title),
            escape(message)
        ),
    )
}

fn bars(counts: &[AcceptanceCount], name: &dyn Fn(&str) -> String) -> Vec<Bar> {
    counts
        .iter()
        .map(|c| Bar {
            label: name(&c.key),
            rate: c.rate(),
            ci95: c.ci95(),
            count: c.shown,
        })
        .collect()
}

/// Lines per series over the days that have any count (the shared axis).
fn lines_by_day(counts: &[DailyCount]) -> (Vec<String>, Vec<Line>) {
    let days: Vec<NaiveDate> = counts
        .iter()
        .map(|c| c.day)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut series: BTreeMap<&str, Line> = BTreeMap::new();
    for c in counts {
        let index = days.binary_search(&c.day).unwrap_or_default();
        let counts = c.counts();
        series
            .entry(c.series.as_str())
            .or_insert_with(|| Line {
                label: c.series.clone(),
                points: Vec::new(),
            })
            .points
            .push((index, counts.rate(), counts.ci95(), c.shown));
    }
    (
        days.iter().map(ToString::to_string).collect(),
        series.into_values().collect(),
    )
}

fn outcomes_table(title: &str, rows: &[AcceptedOutcomes]) -> String {
    let mut html = format!(
        "<table class=\"outcomes\"><caption>{}</caption><tr><th>group</th><th>accepted</th><th>with a reported reliability delta</th><th>mean reliability delta</th><th>mean expected cost change per run</th></tr>",
        escape(title)
    );
    if rows.is_empty() {
        html.push_str("<tr><td colspan=\"5\">no accepted recommendations in this period</td></tr>");
    }
    for row in rows {
        let reliability = row
            .mean_reliability_delta()
            .map_or("–".to_owned(), |m| format!("{m:+.3}"));
        let cost = row
            .mean_cost_delta_usd()
            .map_or("–".to_owned(), |m| format!("{m:+.5} USD"));
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{reliability}</td><td>{cost}</td></tr>",
            escape(&row.key),
            row.accepted,
            row.reliability_reported
        );
    }
    html.push_str("</table>");
    html
}

impl OffPolicy {
    /// The live policy's logged rate and each alternative's SNIPS estimate, with intervals; the
    /// counts are the decisions read and each estimate's effective sample size.
    pub fn chart(&self) -> Chart {
        let mut bars = vec![Bar {
            label: self.logged.key.clone(),
            rate: self.logged.rate(),
            ci95: self.logged.ci95(),
            count: self.logged.shown,
        }];
        for (name, report) in &self.estimates {
            if let Ok(report) = report {
                bars.push(Bar {
                    label: (*name).to_owned(),
                    rate: report.snips.estimate,
                    ci95: [report.snips.lower, report.snips.upper],
                    count: report.effective_sample_size.round() as i64,
                });
            }
        }
        Chart::Bars {
            stem: "off-policy".to_owned(),
            title: "Top-1 acceptance: the live policy and alternatives (SNIPS)".to_owned(),
            bars,
            noun: "decisions",
        }
    }
}

fn off_policy_section(off_policy: Option<&OffPolicy>) -> String {
    let Some(off) = off_policy else {
        return "<p class=\"note\">No logged decision in this period to estimate from.</p>"
            .to_owned();
    };
    let mut rows = String::new();
    let interval = |ci: &bandit::ConfidenceInterval| {
        format!(
            "{} [{}, {}]",
            svg::percent(ci.estimate),
            svg::percent(ci.lower),
            svg::percent(ci.upper)
        )
    };
    for (name, report) in &off.estimates {
        match report {
            Ok(report) => {
                let _ = write!(
                    rows,
                    "<tr><td>{name}</td><td>{}</td><td>{}</td><td>{:.0}</td></tr>",
                    interval(&report.ips),
                    interval(&report.snips),
                    report.effective_sample_size
                );
            }
            Err(error) => {
                let _ = write!(
                    rows,
                    "<tr><td>{name}</td><td colspan=\"3\">no estimate: {}</td></tr>",
                    escape(error)
                );
            }
        }
    }
    format!(
        "<p class=\"note\">Top-1 acceptance the alternative policies would have had on the newest {n} logged decisions in scope (at most {OPE_DECISIONS}), from the logged propensities: IPS and self-normalised IPS with bootstrap 95 % intervals ({OPE_RESAMPLES} resamples); the count beside each estimate is its effective sample size. <code>GET /v1/analytics/ope</code> gives the same estimators on up to {api} decisions.</p><div class=\"grid\">{chart}<table class=\"ope\"><tr><th>policy</th><th>IPS</th><th>SNIPS</th><th>effective decisions</th></tr>{rows}</table></div>",
        n = off.logged.shown,
        api = analytics::OPE_MAX_DECISIONS,
        chart = off.chart().svg(),
    )
}

fn metric(run: &RecordedRun, key: &str) -> Option<f64> {
    run.metrics
        .as_ref()?
        .pointer(&format!("/final/last_rl_step/{key}"))?
        .as_f64()
}

fn runs_section(runs: &[RecordedRun]) -> String {
    let mut html = String::from(
        "<table class=\"runs\"><tr><th>run</th><th>status</th><th>started (UTC)</th><th>finished (UTC)</th><th>steps</th><th>pass@1</th><th>pass@k</th><th>format validity</th><th>true P(accept)</th></tr>",
    );
    if runs.is_empty() {
        html.push_str(
            "<tr><td colspan=\"9\">no training run recorded for this organization</td></tr>",
        );
    }
    let cell = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.3}"));
    for run in runs {
        let steps = run
            .metrics
            .as_ref()
            .and_then(|m| m.get("steps"))
            .and_then(Value::as_u64)
            .map_or("–".to_owned(), |s| s.to_string());
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{steps}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&run.run_id),
            escape(&run.status),
            run.started_at.format("%Y-%m-%d %H:%M"),
            run.finished_at
                .map_or("–".to_owned(), |t| t.format("%Y-%m-%d %H:%M").to_string()),
            cell(metric(run, "pass_at_1")),
            cell(metric(run, "pass_at_k")),
            cell(metric(run, "format_validity")),
            cell(metric(run, "acceptance_probability")),
        );
    }
    html.push_str("</table><div class=\"grid\">");
    for chart in run_curves(runs, RUN_CURVES) {
        html.push_str(&chart.svg());
    }
    html.push_str("</div>");
    html
}

/// The RL pass@1 and pass@k curves of the first `limit` runs that recorded one.
pub fn run_curves(runs: &[RecordedRun], limit: usize) -> Vec<Chart> {
    runs.iter()
        .filter_map(|run| {
            let curve = run
                .metrics
                .as_ref()?
                .pointer("/final/rl_curve")?
                .as_array()
                .filter(|c| !c.is_empty())?;
            let steps: Vec<String> = curve
                .iter()
                .map(|p| {
                    p.get("step")
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                        .to_string()
                })
                .collect();
            let line = |key: &str, label: &str| Line {
                label: label.to_owned(),
                points: curve
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| {
                        let v = p.get(key)?.as_f64()?;
                        Some((i, v, [v, v], 0))
                    })
                    .collect(),
            };
            Some(Chart::Lines {
                stem: format!("run-{}-curves", run.run_id),
                title: format!("{}: training pass@k by RL step", run.run_id),
                x: steps,
                lines: vec![line("pass_at_1", "pass@1"), line("pass_at_k", "pass@k")],
            })
        })
        .take(limit)
        .collect()
}

fn filters_form(d: &Dashboard) -> String {
    let day = |d: Option<NaiveDate>| d.map_or(String::new(), |d| d.to_string());
    let mut options = String::from("<option value=\"\">all clusters</option>");
    for c in &d.clusters {
        let selected = if d.filters.cluster.as_deref() == Some(c.cluster_id.as_str()) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            options,
            "<option value=\"{}\"{selected}>{}</option>",
            escape(&c.cluster_id),
            escape(&d.cluster_name(&c.cluster_id))
        );
    }
    format!(
        "<form class=\"filters\" method=\"get\" action=\"/dashboard\">\
         <label>organization<select name=\"org\"><option selected>{org}</option></select></label>\
         <label>since (first day, UTC)<input type=\"date\" name=\"since\" value=\"{since}\"></label>\
         <label>until (first day excluded)<input type=\"date\" name=\"until\" value=\"{until}\"></label>\
         <label>failure cluster<select name=\"cluster\">{options}</select></label>\
         <button type=\"submit\">Apply</button></form>\
         <form method=\"post\" action=\"/dashboard/logout\" style=\"margin-top:6px\"><button type=\"submit\">Sign out</button></form>",
        org = escape(&d.org),
        since = day(d.filters.period.since),
        until = day(d.filters.period.until),
    )
}

impl Dashboard {
    /// The acceptance charts, in page order: over time per policy version, then by source,
    /// failure cluster, recommendation type and model provider.
    pub fn acceptance_charts(&self) -> [Chart; 5] {
        let (days, lines) = lines_by_day(&self.by_day_and_policy);
        let plain = |key: &str| key.to_owned();
        let cluster = |key: &str| self.cluster_name(key);
        let by = |stem: &str,
                  title: &str,
                  counts: &[AcceptanceCount],
                  name: &dyn Fn(&str) -> String| Chart::Bars {
            stem: stem.to_owned(),
            title: title.to_owned(),
            bars: bars(counts, name),
            noun: "shown",
        };
        [
            Chart::Lines {
                stem: "acceptance-over-time".to_owned(),
                title: "Acceptance per day and policy version (95 % bands)".to_owned(),
                x: days,
                lines,
            },
            by(
                "acceptance-by-source",
                "Acceptance by source (heuristic, each model version)",
                &self.by_source,
                &plain,
            ),
            by(
                "acceptance-by-cluster",
                "Acceptance by failure cluster",
                &self.by_cluster,
                &cluster,
            ),
            by(
                "acceptance-by-type",
                "Acceptance by recommendation type",
                &self.by_type,
                &plain,
            ),
            by(
                "acceptance-by-provider",
                "Acceptance by model provider of the configuration (is the ranking model-neutral?)",
                &self.by_provider,
                &plain,
            ),
        ]
    }

    /// "all time" / "2026-06-01 to 2026-07-01 (excluded)", with the cluster when filtered.
    fn scope_text(&self) -> String {
        let period = match (self.filters.period.since, self.filters.period.until) {
            (None, None) => "all time".to_owned(),
            (since, until) => format!(
                "{} to {}",
                since.map_or("the start".to_owned(), |d| d.to_string()),
                until.map_or("now".to_owned(), |d| format!("{d} (excluded)"))
            ),
        };
        match &self.filters.cluster {
            Some(cluster) => format!("{period}, cluster {}", self.cluster_name(cluster)),
            None => period,
        }
    }
}

/// The headline and every section after it (the dashboard's and the report's).
fn sections(d: &Dashboard) -> String {
    let total = d.total();
    let [lo, hi] = total.ci95();
    let mut body = format!(
        "<p class=\"headline\" id=\"headline\">{scope}: <strong>{accepted}</strong> of <strong>{shown}</strong> shown recommendations accepted, <strong>{rate}</strong> [95 % {lo}, {hi}].</p>\
         <p class=\"note\">A shown recommendation counts as accepted when an <code>accepted</code> or <code>applied</code> answer arrived for it; intervals are Wilson 95 %. \
         The same numbers as <code>GET /v1/analytics/acceptance</code> and <code>arc-rec analytics acceptance</code>.</p>",
        scope = escape(&d.scope_text()),
        accepted = total.accepted,
        shown = total.shown,
        rate = svg::percent(total.rate()),
        lo = svg::percent(lo),
        hi = svg::percent(hi),
    );
    let [over_time, by_source, by_cluster, by_type, by_provider] = d.acceptance_charts();
    body.push_str("<h2>Over time, per policy version</h2>");
    body.push_str(&over_time.svg());
    body.push_str("<h2>By source: are the model's ideas accepted more often than the heuristics'?</h2><div class=\"grid\">");
    body.push_str(&by_source.svg());
    body.push_str("</div><h2>By failure cluster, recommendation type and model provider</h2><div class=\"grid\">");
    for chart in [by_cluster, by_type, by_provider] {
        body.push_str(&chart.svg());
    }
    body.push_str("</div><h2>What accepted recommendations did to reliability and cost</h2><p class=\"note\">Reliability: the delta the platform reported with each accepted recommendation's first accepting answer (<code>reliability_delta</code> of <code>POST /v1/feedback</code>). Cost: the expected change in cost per run each accepted recommendation was served with (<code>expected_cost_delta_usd</code>).</p><div class=\"grid\">");
    body.push_str(&outcomes_table("By source", &d.outcomes_by_source));
    body.push_str(&outcomes_table(
        "By recommendation type",
        &d.outcomes_by_type,
    ));
    body.push_str("</div><h2>Off-policy estimates of alternative policies</h2>");
    body.push_str(&off_policy_section(d.off_policy.as_ref()));
    body.push_str("<h2>Learning rounds: acceptance by round and model version</h2>");
    body.push_str(&rounds_section(&d.rounds, &d.versions));
    body.push_str("<h2>Training runs</h2>");
    body.push_str(&runs_section(&d.runs));
    body
}

/// One row per round (newest first) with its version's acceptance, then the versions no round
/// wrote (`arc-rec candidates` by hand).
fn rounds_section(rounds: &[Round], versions: &[VersionSummary]) -> String {
    let mut html = String::from(
        "<p class=\"note\">Each round (<code>arc-rec round run</code>) trained on the history and the answers to what was served until its window's end; a <code>refused</code> round's model did not beat its warm-up and wrote nothing. A version's acceptance counts every answered shown idea of it (Wilson 95 %); floor: decisions whose first item the exploration floor chose, of those where it could.</p>\
         <table class=\"runs\"><tr><th>round</th><th>status</th><th>window until (UTC)</th><th>new answers</th><th>model version</th><th>version status</th><th>decisions</th><th>answers</th><th>acceptance [95 %]</th><th>floor picks</th></tr>",
    );
    if rounds.is_empty() && versions.is_empty() {
        html.push_str("<tr><td colspan=\"10\">no round or model version yet</td></tr>");
    }
    let version_cells = |id: Option<&str>| -> String {
        let Some(v) = id.and_then(|id| versions.iter().find(|v| v.model_version_id == id)) else {
            return "<td>–</td>".repeat(5);
        };
        let acceptance = v.acceptance().map_or("–".to_owned(), |(rate, [lo, hi])| {
            format!(
                "{} [{}, {}]",
                svg::percent(rate),
                svg::percent(lo),
                svg::percent(hi)
            )
        });
        format!(
            "<td>{}</td><td>{}</td><td>{}</td><td>{acceptance}</td><td>{}/{}</td>",
            v.status.as_str(),
            v.decisions,
            v.answered,
            v.floor.floor_picks,
            v.floor.floor_decisions
        )
    };
    for r in rounds {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
            r.round_no,
            r.status.as_str(),
            r.window_until.format("%Y-%m-%d %H:%M"),
            r.new_answers,
            escape(r.model_version_id.as_deref().unwrap_or("–")),
            version_cells(r.model_version_id.as_deref()),
        );
    }
    for v in versions.iter().filter(|v| {
        !rounds
            .iter()
            .any(|r| r.model_version_id.as_deref() == Some(v.model_version_id.as_str()))
    }) {
        let _ = write!(
            html,
            "<tr><td>–</td><td>–</td><td>–</td><td>–</td><td>{}</td>{}</tr>",
            escape(&v.model_version_id),
            version_cells(Some(&v.model_version_id)),
        );
    }
    html.push_str("</table>");
    html
}

/// The dashboard page.
pub fn page(d: &Dashboard) -> String {
    let body = format!(
        "<h1>arc-rec: acceptance of recommendations — {org}</h1>{form}{sections}",
        org = escape(&d.org),
        form = filters_form(d),
        sections = sections(d),
    );
    document(&format!("arc-rec dashboard — {}", d.org), &body)
}

/// The one-page summary `arc-rec report` writes: the dashboard's sections after the drift
/// alarms, with links to the chart files (`files`: names relative to the page).
pub fn report_page(d: &Dashboard, drift: &DriftReport, files: &[String]) -> String {
    let mut body = format!(
        "<h1>arc-rec report: acceptance of recommendations — {org}</h1><p class=\"note\">Written {now} UTC by <code>arc-rec report</code>.</p>",
        org = escape(&d.org),
        now = chrono::Utc::now().format("%Y-%m-%d %H:%M"),
    );
    body.push_str("<h2>Drift alarms: is a failure cluster's acceptance dropping?</h2>");
    body.push_str(&drift_section(drift));
    body.push_str(&sections(d));
    body.push_str("<h2>The charts as files</h2><ul>");
    for file in files {
        let _ = write!(body, "<li><a href=\"{f}\">{f}</a></li>", f = escape(file));
    }
    body.push_str("</ul>");
    document(&format!("arc-rec report — {}", d.org), &body)
}

fn drift_section(report: &DriftReport) -> String {
    let Some(from) = report.recent_from else {
        return "<p class=\"note\">No decisions in this period: nothing to test.</p>".to_owned();
    };
    let alarms = report.tested.iter().filter(|c| c.alarm).count();
    let mut html = format!(
        "<p class=\"headline\" id=\"drift\"><strong>{alarms}</strong> alarm(s) among {tested} cluster(s) tested.</p>\
         <p class=\"note\">The test: the recent window is the last {days} days of the period (from {from}), the baseline every earlier day; \
         a cluster with at least {min} shown recommendations in both is tested with a one-sided two-proportion z-test (pooled variance) of a drop, \
         and raises an alarm when p &lt; {alpha} / {tested} (Bonferroni over the clusters tested).</p>\
         <table class=\"drift\"><tr><th>cluster</th><th>baseline</th><th>recent</th><th>change</th><th>z</th><th>p (one-sided)</th><th>alarm</th></tr>",
        tested = report.tested.len(),
        days = drift::RECENT_DAYS,
        min = drift::MIN_SHOWN,
        alpha = drift::ALPHA,
    );
    for c in &report.tested {
        let cell = |count: &AcceptanceCount| {
            format!(
                "{} ({} of {})",
                svg::percent(count.rate()),
                count.accepted,
                count.shown
            )
        };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:+.1} points</td><td>{:.2}</td><td>{:.2e}</td><td>{}</td></tr>",
            escape(&c.cluster),
            cell(&c.baseline),
            cell(&c.recent),
            100.0 * (c.recent.rate() - c.baseline.rate()),
            c.z,
            c.p_value,
            if c.alarm {
                "<strong>ALARM</strong>"
            } else {
                "no"
            }
        );
    }
    html.push_str("</table>");
    if !report.untested.is_empty() {
        let _ = write!(
            html,
            "<p class=\"note\">Too few shown to test: {}.</p>",
            escape(&report.untested.join(", "))
        );
    }
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(key: &str, shown: i64, accepted: i64) -> AcceptanceCount {
        AcceptanceCount {
            key: key.to_owned(),
            shown,
            accepted,
        }
    }

    fn dashboard() -> Dashboard {
        let day = |d: u32| NaiveDate::from_ymd_opt(2026, 6, d).unwrap();
        Dashboard {
            org: "acme".to_owned(),
            filters: Filters::default(),
            clusters: vec![ClusterName {
                cluster_id: "c-1".to_owned(),
                label: Some("tool timeouts".to_owned()),
            }],
            by_day_and_policy: vec![
                DailyCount {
                    day: day(1),
                    series: "p1".to_owned(),
                    shown: 10,
                    accepted: 5,
                },
                DailyCount {
                    day: day(2),
                    series: "p1".to_owned(),
                    shown: 10,
                    accepted: 6,
                },
            ],
            by_source: vec![count("heuristic", 15, 8), count("model:v1", 5, 3)],
            by_cluster: vec![count("c-1", 20, 11)],
            by_type: vec![count("model_switch", 12, 6), count("<script>", 8, 5)],
            by_provider: vec![count("openai", 20, 11)],
            outcomes_by_source: vec![AcceptedOutcomes {
                key: "heuristic".to_owned(),
                accepted: 8,
                reliability_reported: 4,
                reliability_delta_sum: 0.5,
                cost_known: 8,
                cost_delta_sum: 0.004,
            }],
            outcomes_by_type: Vec::new(),
            runs: Vec::new(),
            rounds: Vec::new(),
            versions: Vec::new(),
            off_policy: None,
        }
    }

    #[test]
    fn the_page_states_the_totals_and_every_grouping_with_escaped_keys() {
        let html = page(&dashboard());
        assert!(
            html.contains("<strong>11</strong> of <strong>20</strong> shown recommendations accepted, <strong>55.0 %</strong>"),
            "{html}"
        );
        assert!(html.contains("c-1 (tool timeouts)"), "{html}");
        assert!(html.contains("&lt;script&gt;") && !html.contains("<script>"));
        assert!(html.contains("60.0 % [")); // model:v1, 3 of 5
        assert!(
            html.contains("+0.125"),
            "mean reported delta 0.5 / 4: {html}"
        );
        assert!(html.contains("no training run recorded"));
        assert!(html.contains("no round or model version yet"));
        assert_eq!(html.matches("<svg").count(), 5, "{html}");
    }

    #[test]
    fn rounds_are_listed_with_their_version_s_acceptance() {
        use crate::storage::model_versions::{FloorCounts, VersionStatus};
        use crate::storage::rounds::RoundStatus;
        let at = chrono::DateTime::parse_from_rfc3339("2026-06-02T10:00:00Z")
            .unwrap()
            .to_utc();
        let mut d = dashboard();
        d.rounds = vec![Round {
            org_id: "acme".to_owned(),
            round_no: 1,
            status: RoundStatus::Served,
            window_since: None,
            window_until: at,
            new_answers: 42,
            dir: "rounds/round-001".to_owned(),
            model_version_id: Some("rft-1".to_owned()),
            figures: serde_json::json!({}),
            started_at: at,
            finished_at: Some(at),
        }];
        let version = |id: &str, answered, accepted| VersionSummary {
            org_id: "acme".to_owned(),
            model_version_id: id.to_owned(),
            base_model: "tiny".to_owned(),
            created_at: at,
            status: VersionStatus::Live,
            status_changed_at: at,
            candidates: 8,
            decisions: 30,
            answered,
            accepted,
            floor: FloorCounts {
                floor_decisions: 10,
                floor_picks: 2,
                ..FloorCounts::default()
            },
        };
        d.versions = vec![version("rft-1", 20, 10), version("<by-hand>", 4, 1)];
        let html = page(&d);
        assert!(
            html.contains("<td>1</td><td>served</td><td>2026-06-02 10:00</td><td>42</td><td>rft-1</td><td>live</td><td>30</td><td>20</td><td>50.0 % ["),
            "{html}"
        );
        assert!(html.contains("<td>2/10</td>"));
        // A version no round wrote is listed too, escaped.
        assert!(html.contains("&lt;by-hand&gt;") && html.contains("25.0 % ["));
    }

    #[test]
    fn the_login_page_escapes_its_message() {
        let html = login_page(Some("bad <key>"));
        assert!(html.contains("bad &lt;key&gt;"));
        assert!(html.contains("type=\"password\" name=\"key\""));
    }
}
