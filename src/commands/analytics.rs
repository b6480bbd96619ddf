//! `arc-rec analytics`: the analyst API's numbers in a terminal, from the same query code
//! (`storage::analytics`) and the same JSON shape (`api::routes::analytics`).

use chrono::NaiveDate;
use clap::{Args, Subcommand, ValueEnum};

use crate::api::routes::analytics::AcceptanceResponse;
use crate::storage::Database;
use crate::storage::analytics::{self, GroupBy, Period, Scope};

/// `arc-rec analytics ...`.
#[derive(Debug, Subcommand)]
pub enum AnalyticsCommand {
    /// Acceptance rates of shown recommendations with counts and Wilson 95 % intervals, grouped
    /// (the numbers of `GET /v1/analytics/acceptance`). A shown item counts as accepted when an
    /// `accepted` or `applied` answer arrived for it.
    Acceptance(AcceptanceArgs),
}

/// `arc-rec analytics acceptance`.
#[derive(Debug, Args)]
pub struct AcceptanceArgs {
    /// What to group by.
    #[arg(long, value_enum)]
    pub group_by: Group,
    #[command(flatten)]
    pub scope: ScopeArgs,
    /// How to print them.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Which decisions an analyst command counts (`arc-rec analytics`, `arc-rec report`).
#[derive(Debug, Args)]
pub struct ScopeArgs {
    /// First day included (YYYY-MM-DD, UTC).
    #[arg(long, value_parser = parse_day)]
    pub since: Option<NaiveDate>,
    /// First day excluded (YYYY-MM-DD, UTC).
    #[arg(long, value_parser = parse_day)]
    pub until: Option<NaiveDate>,
    /// One organization's figures; without it, every organization's together.
    #[arg(long)]
    pub org: Option<String>,
    /// Only decisions placed in this failure cluster.
    #[arg(long)]
    pub cluster: Option<String>,
}

impl ScopeArgs {
    /// The storage scope; an empty or inverted period is an error naming `--since`.
    pub fn scope(&self) -> anyhow::Result<Scope<'_>> {
        let period =
            Period::new(self.since, self.until).map_err(|err| anyhow::anyhow!("--since: {err}"))?;
        Ok(Scope {
            org: self.org.as_deref(),
            period,
            cluster: self.cluster.as_deref(),
        })
    }
}

/// The groupings (the API's `group_by`, with `policy` for `policy_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Group {
    /// Failure cluster of the context.
    Cluster,
    /// Recommendation type.
    Type,
    /// Model provider of the configuration.
    Provider,
    /// `heuristic`, or `model:<model version>` for the recommender model's ideas.
    Source,
    /// Serving policy version.
    #[value(alias = "policy-version", alias = "policy_version")]
    Policy,
    /// UTC day of the decision.
    Day,
}

impl From<Group> for GroupBy {
    fn from(group: Group) -> Self {
        match group {
            Group::Cluster => GroupBy::Cluster,
            Group::Type => GroupBy::Type,
            Group::Provider => GroupBy::Provider,
            Group::Source => GroupBy::Source,
            Group::Policy => GroupBy::PolicyVersion,
            Group::Day => GroupBy::Day,
        }
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// `key,shown,accepted,rate,ci95_low,ci95_high` with a header line.
    Csv,
    /// The API's response body.
    Json,
}

fn parse_day(text: &str) -> Result<NaiveDate, String> {
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map_err(|err| format!("expected a UTC day as YYYY-MM-DD ({err})"))
}

/// Runs an analytics command, printing to stdout.
pub async fn run(command: &AnalyticsCommand, database: &Database) -> anyhow::Result<()> {
    match command {
        AnalyticsCommand::Acceptance(args) => {
            let scope = args.scope.scope()?;
            let group_by = GroupBy::from(args.group_by);
            let counts = analytics::acceptance(database.pool(), scope, group_by).await?;
            let response = AcceptanceResponse::new(group_by, counts);
            print!("{}", render(&response, args.format)?);
            Ok(())
        }
    }
}

/// The response in `format`, ending with a newline.
fn render(response: &AcceptanceResponse, format: Format) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    match format {
        Format::Json => {
            out = serde_json::to_string_pretty(response)?;
            out.push('\n');
        }
        Format::Csv => {
            out.push_str("key,shown,accepted,rate,ci95_low,ci95_high\n");
            for row in &response.rows {
                writeln!(
                    out,
                    "{},{},{},{:.6},{:.6},{:.6}",
                    csv_field(&row.key),
                    row.shown,
                    row.accepted,
                    row.rate,
                    row.ci95[0],
                    row.ci95[1]
                )?;
            }
        }
        Format::Table => {
            let width = response
                .rows
                .iter()
                .map(|row| row.key.chars().count())
                .chain([3])
                .max()
                .unwrap_or(3);
            writeln!(
                out,
                "{:<width$}  {:>9}  {:>9}  {:>6}  95% interval",
                "key", "shown", "accepted", "rate"
            )?;
            for row in &response.rows {
                writeln!(
                    out,
                    "{:<width$}  {:>9}  {:>9}  {:>6.3}  [{:.3}, {:.3}]",
                    row.key, row.shown, row.accepted, row.rate, row.ci95[0], row.ci95[1]
                )?;
            }
            if response.rows.is_empty() {
                out.push_str("(no shown recommendations in this period)\n");
            }
        }
    }
    Ok(out)
}

/// A CSV field, quoted when it holds a comma, quote or line break (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::analytics::AcceptanceCount;

    fn response() -> AcceptanceResponse {
        AcceptanceResponse::new(
            GroupBy::Source,
            vec![
                AcceptanceCount {
                    key: "heuristic".into(),
                    shown: 40,
                    accepted: 10,
                },
                AcceptanceCount {
                    key: "model:a,\"b\"".into(),
                    shown: 0,
                    accepted: 0,
                },
            ],
        )
    }

    #[test]
    fn csv_quotes_keys_that_need_it_and_prints_the_api_s_numbers() {
        let csv = render(&response(), Format::Csv).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "key,shown,accepted,rate,ci95_low,ci95_high");
        assert!(lines[1].starts_with("heuristic,40,10,0.250000,"), "{csv}");
        assert!(lines[2].starts_with("\"model:a,\"\"b\"\"\",0,0,0.000000,0.000000,1.000000"));
    }

    #[test]
    fn the_table_aligns_columns_and_says_when_it_is_empty() {
        let table = render(&response(), Format::Table).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1].find("40"), lines[0].find("shown").map(|i| i + 3));
        let empty = render(
            &AcceptanceResponse::new(GroupBy::Day, vec![]),
            Format::Table,
        )
        .unwrap();
        assert!(empty.contains("no shown recommendations"), "{empty}");
    }

    #[test]
    fn a_bad_day_is_explained() {
        let err = parse_day("2026-13-01").unwrap_err();
        assert!(err.contains("YYYY-MM-DD"), "{err}");
    }
}
