//! `arc-rec train` through the binary: a SIGKILL (also one in the middle of a checkpoint write)
//! and `--resume` give the same metrics as an uninterrupted run; a NaN loss rolls back; runs are
//! recorded; bad input is named.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arc_rec::training::{MetricsLine, read_metrics};
use tokio::sync::OnceCell;

use crate::helpers::{TestDb, arc_rec, fresh_database, run, training_world, world_grader_args};

/// A data file, a tiny checkpoint and the database they came from, made once per test binary.
struct Fixture {
    db: TestDb,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn data(&self) -> PathBuf {
        self.dir.path().join("examples.jsonl")
    }

    fn model(&self) -> PathBuf {
        self.dir.path().join("tiny")
    }
}

static FIXTURE: OnceCell<Fixture> = OnceCell::const_new();

async fn fixture() -> &'static Fixture {
    FIXTURE
        .get_or_init(|| async {
            let db = fresh_database().await;
            let dir = tempfile::tempdir().unwrap();
            training_world(&db.url, dir.path(), None);
            Fixture { db, dir }
        })
        .await
}

/// A short run: 4 warm-up steps, 6 RL steps of 2 prompts × 4 samples, checkpoints every 2 steps.
fn train_command(fixture: &Fixture, out: &Path) -> assert_cmd::Command {
    let mut cmd = arc_rec(&fixture.db.url);
    cmd.arg("train")
        .arg("--data")
        .arg(fixture.data())
        .arg("--model")
        .arg(fixture.model())
        .arg("--out")
        .arg(out)
        .args(world_grader_args())
        .args(["--sft-steps", "4", "--sft-batch", "4", "--steps", "6"])
        .args(["--k", "2", "--n", "4", "--prompts-per-step", "2"])
        .args(["--max-new-tokens", "24", "--checkpoint-every", "2"])
        .args(["--lr-warmup-steps", "1", "--device", "cpu", "--seed", "7"])
        // Sampling below temperature 1 with adapter dropout configured, two passes of two
        // minibatches: the update must still score the samples as they were drawn.
        .args(["--temperature", "0.7", "--lora-dropout", "0.1"])
        .args(["--update-epochs", "2", "--minibatches", "2"])
        // The forbidden-mass penalty is part of the loss, and of what a resume must restore.
        .args(["--forbidden-mass-coef", "0.5"])
        // A random-initialised model never writes a valid recommendation, so every reward is −1
        // and every advantage 0: keeping those groups with a KL penalty still gives the RL steps
        // a gradient, so they exercise the optimizer, its saved state and the rollback.
        .args([
            "--objective",
            "pass@k",
            "--keep-zero-advantage-groups",
            "--kl-coef",
            "0.1",
        ]);
    cmd
}

fn resume_command(fixture: &Fixture, out: &Path) -> assert_cmd::Command {
    let mut cmd = arc_rec(&fixture.db.url);
    cmd.arg("train").arg("--resume").arg(out).arg("--no-record");
    cmd
}

/// Runs `first` (a run into `dir`) until the SIGKILL while it writes step `step`'s checkpoint,
/// then resumes the run to its end.
fn kill_in_checkpoint_then_resume(
    fixture: &Fixture,
    mut first: assert_cmd::Command,
    dir: &Path,
    step: u64,
) {
    let output = first
        .env("ARC_REC_TEST_KILL_IN_CHECKPOINT", step.to_string())
        .output()
        .unwrap();
    assert_eq!(output.status.signal(), Some(9), "{output:?}");
    run(&mut resume_command(fixture, dir));
}

fn timeless(root: &Path) -> Vec<MetricsLine> {
    read_metrics(root)
        .unwrap()
        .iter()
        .map(MetricsLine::without_timings)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_runs_resume_to_the_same_metrics_as_an_uninterrupted_run() {
    let fixture = fixture().await;
    let root = tempfile::tempdir().unwrap();

    let straight = root.path().join("straight");
    run(train_command(fixture, &straight).arg("--no-record"));
    let expected = timeless(&straight);
    let steps = expected
        .iter()
        .filter(|line| matches!(line, MetricsLine::Step(_)))
        .count();
    assert_eq!(steps, 10, "one line per step");
    // Checkpoint selection scores RL's first step (the warm-up) and its last: a resumed run
    // must reproduce those lines too.
    let selection = expected
        .iter()
        .filter(|line| matches!(line, MetricsLine::Selection(_)))
        .count();
    assert_eq!(selection, 2, "{expected:?}");
    let updates = expected
        .iter()
        .filter(|line| matches!(line, MetricsLine::Step(step) if step.updated && step.rl.is_some()))
        .count();
    assert!(updates > 0, "no RL step updated the policy: {expected:?}");
    for line in &expected {
        if let MetricsLine::Step(step) = line
            && let Some(rl) = &step.rl
            && step.updated
        {
            assert_eq!(rl.optimizer_steps, Some(4), "{line:?}");
            let deviation = rl.max_abs_log_ratio.unwrap();
            assert!(deviation < 1e-3, "first-minibatch |log ratio| {deviation}");
            let forbidden = rl.forbidden_mass.expect("constrained samples measure it");
            assert!(
                (0.0..1.0).contains(&forbidden),
                "forbidden mass {forbidden}"
            );
        }
    }

    // SIGKILL in the middle of writing step 4's checkpoint, the first of RL (the warm-up model is
    // written, RL's adapters too, their optimizer state not): the resume redoes warm-up steps 2
    // and 3 from the full-weight checkpoint of step 2 and rewrites the warm-up model.
    let in_checkpoint = root.path().join("in-checkpoint");
    let output = train_command(fixture, &in_checkpoint)
        .arg("--no-record")
        .env("ARC_REC_TEST_KILL_IN_CHECKPOINT", "4")
        .output()
        .unwrap();
    assert_eq!(output.status.signal(), Some(9), "{output:?}");
    assert!(
        in_checkpoint
            .join("checkpoints/.tmp-step-00000004")
            .is_dir()
    );
    let stdout = run(&mut resume_command(fixture, &in_checkpoint));
    assert!(stdout.contains("resuming at step 2"), "{stdout}");
    assert_eq!(timeless(&in_checkpoint), expected);

    // SIGKILL from outside at whatever point the run has reached after its first RL steps.
    let external = root.path().join("external");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("arc-rec"))
        .env("DATABASE_URL", &fixture.db.url)
        .args(train_command(fixture, &external).get_args())
        .arg("--no-record")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let lines = std::fs::read_to_string(external.join("metrics.jsonl"))
            .map(|text| text.lines().count())
            .unwrap_or(0);
        if lines >= 7 || Instant::now() > deadline {
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the run ended before it was killed"
    );
    run(&mut resume_command(fixture, &external));
    assert_eq!(timeless(&external), expected);

    // A finished run has its adapters and curves.
    for dir in [&straight, &in_checkpoint, &external] {
        for file in [
            "adapter/adapter_config.json",
            "adapter/adapter_model.safetensors",
            "warmup-model/model.safetensors",
            "warmup-model/tokenizer.json",
            "curves.png",
            "summary.json",
            "config.json",
        ] {
            assert!(dir.join(file).is_file(), "{} lacks {file}", dir.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nan_loss_rolls_back_with_a_lower_learning_rate_and_the_run_is_recorded() {
    let fixture = fixture().await;
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("run");
    let stdout = run(train_command(fixture, &out).env("ARC_REC_TEST_NAN_LOSS_AT", "7"));
    assert!(stdout.contains("rolled back to step 6"), "{stdout}");
    assert!(
        stdout.contains("recorded run and model version"),
        "{stdout}"
    );
    let lines = read_metrics(&out).unwrap();
    let rollbacks: Vec<_> = lines
        .iter()
        .filter_map(|line| match line {
            MetricsLine::Rollback(rollback) => Some(rollback),
            MetricsLine::Step(_) | MetricsLine::Selection(_) => None,
        })
        .collect();
    assert_eq!(rollbacks.len(), 1, "{lines:?}");
    assert_eq!((rollbacks[0].at_step, rollbacks[0].to_step), (7, 6));
    assert!(rollbacks[0].reason.contains("non-finite loss"));
    assert_eq!(rollbacks[0].lr_scale, 0.5);
    assert_eq!(
        lines
            .iter()
            .filter(|line| !matches!(line, MetricsLine::Selection(_)))
            .count(),
        11,
        "10 steps and the rollback"
    );
    let redone = lines.iter().find_map(|line| match line {
        MetricsLine::Step(step) if step.step == 7 => Some(step),
        _ => None,
    });
    let before = lines.iter().find_map(|line| match line {
        MetricsLine::Step(step) if step.step == 5 => Some(step),
        _ => None,
    });
    // Steps after the rollback run at half the scheduled rate (constant schedule here is not
    // used; compare to the schedule through the config instead).
    let settings: arc_rec::training::TrainSettings =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        redone.unwrap().learning_rate,
        settings.learning_rate_at(7) * 0.5
    );
    assert_eq!(before.unwrap().learning_rate, settings.learning_rate_at(5));
    assert_eq!(rollbacks[0].salt, 1);
    assert!(rollbacks[0].kl_coef.unwrap() >= 0.2, "{:?}", rollbacks[0]);
    let retried = redone.unwrap().rl.as_ref().unwrap();
    assert!(retried.kl_coef.unwrap() >= 0.2, "β raised for the retry");

    // A rollback, then a SIGKILL while checkpointing the step after it: the resumed run continues
    // with the rollback's salt, learning rate and β, exactly as the uninterrupted run did.
    let killed = root.path().join("rollback-then-kill");
    let mut first = train_command(fixture, &killed);
    first
        .arg("--no-record")
        .env("ARC_REC_TEST_NAN_LOSS_AT", "7");
    kill_in_checkpoint_then_resume(fixture, first, &killed, 8);
    assert_eq!(timeless(&killed), timeless(&out));

    let run_id = std::fs::read_to_string(out.join("run_id")).unwrap();
    // The fixture's pool belongs to the runtime of whichever test made it, which may have shut
    // down by now: query through a connection of this test's own.
    let pool = fixture.db.pool_here().await;
    let runs: Vec<(String, String)> = sqlx::query_as(
        "SELECT org_id, status FROM training_runs WHERE run_id = $1 ORDER BY org_id",
    )
    .bind(run_id.trim())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!runs.is_empty());
    assert!(
        runs.iter().all(|(_, status)| status == "succeeded"),
        "{runs:?}"
    );
    let adapters: Vec<String> =
        sqlx::query_scalar("SELECT adapter_path FROM model_versions WHERE model_version_id = $1")
            .bind(run_id.trim())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(adapters.len(), runs.len());
    assert!(
        Path::new(&adapters[0])
            .join("adapter_model.safetensors")
            .is_file()
    );
}

/// `--grader learned`: the fit is kept in the run, a killed run resumes to the same metrics
/// (which carry the learned and the world's probabilities side by side), a tampered fit is
/// refused, and eval grades with the run's fit or the world.
#[tokio::test(flavor = "multi_thread")]
async fn a_learned_grader_run_keeps_its_fit_resumes_exactly_and_evaluates() {
    let fixture = fixture().await;
    let root = tempfile::tempdir().unwrap();
    let learned = |out: &Path| {
        let mut cmd = train_command(fixture, out);
        cmd.args(["--grader", "learned", "--no-record"]);
        cmd
    };
    let out = root.path().join("run");
    let stdout = run(&mut learned(&out));
    assert!(
        stdout.contains("learned grader: fitted on") && stdout.contains("overoptimisation.png"),
        "{stdout}"
    );
    assert!(out.join("grader.json").is_file() && out.join("overoptimisation.png").is_file());
    // Its held-out calibration, printed and kept: the world's export has only the platform's
    // decisions.
    assert!(stdout.contains("held-out decisions (log-loss "), "{stdout}");
    let fit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("grader.json")).unwrap()).unwrap();
    let held_out = &fit["held_out"];
    assert!(
        held_out["all"]["decisions"].as_u64() > Some(0),
        "{held_out}"
    );
    assert!(
        held_out["all"]["log_loss"].as_f64() > Some(0.0),
        "{held_out}"
    );
    assert_eq!(
        held_out["by_origin"]["platform"], held_out["all"],
        "{held_out}"
    );
    // The learned grader's default KL budget (β 0.05 towards 0.1) yields to the fixture's own
    // --kl-coef: a fixed β, no target.
    assert!(stdout.contains("KL penalty: β 0.1\n"), "{stdout}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (&config["kl_coef"], &config["kl_target"]),
        (&serde_json::json!(0.1), &serde_json::Value::Null),
        "{config}"
    );
    let rl: Vec<_> = read_metrics(&out)
        .unwrap()
        .into_iter()
        .filter_map(|line| match line {
            MetricsLine::Step(step) => step.rl,
            MetricsLine::Rollback(_) | MetricsLine::Selection(_) => None,
        })
        .collect();
    assert_eq!(rl.len(), 6);
    for m in &rl {
        assert!(m.kl_coef.is_some_and(|beta| beta > 0.0), "{m:?}");
        // Batch means over the samples, malformed ones counting 0: the pessimistic bound under
        // the mean, and the world's truth beside them (the data comes from a world).
        let (mean, bound) = (
            m.learned_probability.unwrap(),
            m.learned_lower_bound.unwrap(),
        );
        assert!(
            (0.0..=m.format_validity).contains(&mean) && bound <= mean,
            "{m:?}"
        );
        assert!((0.0..=m.format_validity).contains(&m.acceptance_probability.unwrap()));
    }
    assert!(
        rl.iter().any(|m| m.learned_lower_bound.unwrap() > 0.0),
        "{rl:?}"
    );

    // The same run from its settings and fit (a second fit would read the database's
    // statistics again, whose float aggregates Postgres may sum in another order), killed while
    // checkpointing and resumed: the same metrics, bit for bit.
    let killed = root.path().join("killed");
    std::fs::create_dir_all(&killed).unwrap();
    for file in ["config.json", "grader.json", "run_id"] {
        std::fs::copy(out.join(file), killed.join(file)).unwrap();
    }
    kill_in_checkpoint_then_resume(fixture, resume_command(fixture, &killed), &killed, 8);
    assert_eq!(timeless(&killed), timeless(&out));

    let stdout = run(arc_rec(&fixture.db.url)
        .args(["eval", "--run"])
        .arg(&out)
        .args([
            "--n",
            "2",
            "--max-prompts",
            "2",
            "--device",
            "cpu",
            "--json",
        ]));
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["grader"], "learned", "{report}");
    // The reward model as a chooser is measured against the truth only.
    assert!(report["models"][0]["learned_pick_of"].is_null(), "{report}");
    let stdout = run(arc_rec(&fixture.db.url)
        .args(["eval", "--run"])
        .arg(&out)
        .args(["--grader", "world", "--n", "2", "--max-prompts", "2"])
        .args(["--device", "cpu", "--json"]));
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["grader"], "world", "{report}");
    assert!(report["baselines"].is_object(), "{report}");
    // Each prompt names its greedy answer when the greedy completion is well formed.
    for model in report["models"].as_array().unwrap() {
        for prompt in model["per_prompt"].as_array().unwrap() {
            assert_eq!(
                prompt["greedy_answer"].is_string(),
                prompt["greedy_format_valid"].as_bool().unwrap(),
                "{prompt}"
            );
        }
    }
    // The learned grader's pick of k lies between a sample (k = 1, where it is the mean) and the
    // truth's best of k, overall and per prompt.
    let figures = |value: &serde_json::Value| -> Vec<f64> {
        let values = value.as_array().unwrap_or_else(|| panic!("{value}"));
        values.iter().map(|v| v.as_f64().unwrap()).collect()
    };
    for model in report["models"].as_array().unwrap() {
        let rows = std::iter::once(model).chain(model["per_prompt"].as_array().unwrap());
        for row in rows {
            let (picks, best) = (figures(&row["learned_pick_of"]), figures(&row["best_of"]));
            assert_eq!(picks.len(), 2, "{row}");
            assert!((picks[0] - best[0]).abs() < 1e-12, "{row}");
            for (pick, best) in picks.iter().zip(&best) {
                assert!((0.0..=best + 1e-12).contains(pick), "{row}");
            }
        }
    }

    // A fit that is not what the data gives is refused before any model loads.
    let grader_file = killed.join("grader.json");
    let mut fit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&grader_file).unwrap()).unwrap();
    fit["mean"][0] = serde_json::json!(fit["mean"][0].as_f64().unwrap() + 0.5);
    std::fs::write(&grader_file, serde_json::to_vec(&fit).unwrap()).unwrap();
    let output = resume_command(fixture, &killed).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("refitting on the same data"),
        "{stderr}"
    );
    std::fs::remove_file(&grader_file).unwrap();
    let output = arc_rec(&fixture.db.url)
        .args(["eval", "--grader", "learned", "--run"])
        .arg(&killed)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("no grader.json"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_named() {
    let fixture = fixture().await;
    let root = tempfile::tempdir().unwrap();
    let empty_train = root.path().join("validation-only.jsonl");
    let validation_only: String = std::fs::read_to_string(fixture.data())
        .unwrap()
        .lines()
        .filter(|line| {
            line.contains("\"split\":\"validation\"") || line.contains("\"split\": \"validation\"")
        })
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(!validation_only.is_empty());
    std::fs::write(&empty_train, validation_only).unwrap();
    let not_a_checkpoint = root.path().join("empty-model");
    std::fs::create_dir_all(&not_a_checkpoint).unwrap();

    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--data".into(), "/nonexistent/examples.jsonl".into()],
            "/nonexistent/examples.jsonl",
        ),
        (
            vec![
                "--data".into(),
                fixture.model().join("config.json").display().to_string(),
            ],
            "config.json",
        ),
        (
            vec!["--model".into(), not_a_checkpoint.display().to_string()],
            "not a model checkpoint",
        ),
        (vec!["--k".into(), "1".into()], "--k"),
        (vec!["--n".into(), "1".into()], "--n"),
        (
            vec!["--data".into(), empty_train.display().to_string()],
            "train split is empty",
        ),
        // The fixture's world is not the default world 1: the world grader cannot judge this
        // data, and the error names the grader a platform's own data wants.
        (vec!["--grader".into(), "world".into()], "--grader learned"),
    ];
    for (index, (overrides, expected)) in cases.into_iter().enumerate() {
        let mut args = vec![
            "train".to_owned(),
            "--no-record".to_owned(),
            "--device".to_owned(),
            "cpu".to_owned(),
            "--out".to_owned(),
            root.path()
                .join(format!("run-{index}"))
                .display()
                .to_string(),
        ];
        for flag in ["--data", "--model"] {
            if !overrides.iter().any(|o| o == flag) {
                args.push(flag.to_owned());
                args.push(match flag {
                    "--data" => fixture.data().display().to_string(),
                    _ => fixture.model().display().to_string(),
                });
            }
        }
        args.extend(overrides);
        let output = arc_rec(&fixture.db.url).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        // Checked before anything is made: no half-made run directory is left behind.
        assert!(
            !root.path().join(format!("run-{index}")).exists(),
            "{args:?} left a run directory"
        );
    }

    // Without --grader, data that is not the given world's is a platform's own: the learned
    // grader is chosen (and said), before the model is read.
    let output = arc_rec(&fixture.db.url)
        .args(["train", "--no-record", "--device", "cpu", "--data"])
        .arg(fixture.data())
        .arg("--model")
        .arg(&not_a_checkpoint)
        .arg("--out")
        .arg(root.path().join("run-default-grader"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success());
    assert!(stdout.contains("grader: learned (the data's configurations are not those of the world of --world-seed 1"), "{stdout}");
}

/// Issue 53: under the grammar (model and tool names from the organization's catalogue, lists
/// bounded, and a sample near its token limit closed by construction) a barely trained model's
/// RL samples and evaluation are all well formed. Before, a briefly trained run had 2 of 24
/// samples cut at the limit inside a tool list, and with the catalogue alone 1 of 16 here.
#[tokio::test(flavor = "multi_thread")]
async fn a_barely_trained_model_writes_only_well_formed_recommendations_under_the_grammar() {
    let fixture = fixture().await;
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("run");
    run(arc_rec(&fixture.db.url)
        .arg("train")
        .arg("--data")
        .arg(fixture.data())
        .arg("--model")
        .arg(fixture.model())
        .arg("--out")
        .arg(&out)
        .args(world_grader_args())
        // 40 warm-up steps of 4 examples (not the default 16): enough to leave the random init,
        // not enough to write well; the grammar, not the training, is what is tested.
        .args(["--sft-steps", "40", "--sft-batch", "4"])
        .args(["--steps", "2", "--eval-every", "0"])
        .args(["--k", "2", "--n", "8", "--prompts-per-step", "2"])
        .args(["--device", "cpu", "--seed", "3", "--no-record"]));
    let lines = read_metrics(&out).unwrap();
    let rl: Vec<_> = lines
        .iter()
        .filter_map(|line| match line {
            MetricsLine::Step(step) => step.rl.as_ref(),
            MetricsLine::Rollback(_) | MetricsLine::Selection(_) => None,
        })
        .collect();
    assert_eq!(rl.len(), 2);
    for metrics in rl {
        assert_eq!(metrics.format_validity, 1.0, "{metrics:?}");
    }
    let stdout = run(arc_rec(&fixture.db.url)
        .args(["eval", "--run"])
        .arg(&out)
        .args(["--models", "warmup", "--n", "8", "--max-prompts", "4"])
        .args(["--device", "cpu", "--json"]));
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for model in report["models"].as_array().unwrap() {
        assert_eq!(model["format_validity"], 1.0, "{model}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn eval_compares_the_base_warm_up_and_rl_models_on_held_out_prompts() {
    let fixture = fixture().await;
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("run");
    run(train_command(fixture, &out).arg("--no-record"));

    let stdout = run(arc_rec(&fixture.db.url)
        .args(["eval", "--run"])
        .arg(&out)
        .args([
            "--n",
            "4",
            "--max-prompts",
            "3",
            "--device",
            "cpu",
            "--json",
        ]));
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["split"], "test");
    assert_eq!(report["grader"], "world");
    let models = report["models"].as_array().unwrap();
    let names: Vec<&str> = models
        .iter()
        .map(|m| m["model"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["base", "warmup", "rl"]);
    let numbers = |value: &serde_json::Value| -> Vec<f64> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    for model in models {
        let prompts = model["prompts"].as_u64().unwrap();
        assert!((1..=3).contains(&prompts), "--max-prompts 3: {prompts}");
        for curve in ["pass_at", "maj_at", "best_of"] {
            let values = numbers(&model[curve]);
            assert_eq!(values.len(), 4, "{curve}: one value per k = 1..n");
            assert!(values.iter().all(|v| (0.0..=1.0).contains(v)), "{curve}");
        }
        // More samples never lower pass@k or the best of k.
        for curve in ["pass_at", "best_of"] {
            let values = numbers(&model[curve]);
            assert!(values.windows(2).all(|w| w[1] >= w[0] - 1e-12), "{curve}");
        }
        let validity = model["format_validity"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&validity));
        // Every malformed sample is counted once, under its reason.
        let malformed: u64 = model["format_errors"]
            .as_object()
            .unwrap()
            .values()
            .map(|count| count.as_u64().unwrap())
            .sum();
        let samples = (prompts * 4) as f64;
        assert!(
            (malformed as f64 - (1.0 - validity) * samples).abs() < 1e-6,
            "{malformed} malformed of {samples} samples at validity {validity}"
        );
        // Each reason comes with its first sample's message.
        let reasons: Vec<&String> = model["format_errors"].as_object().unwrap().keys().collect();
        let examples = model["format_error_examples"].as_object().unwrap();
        assert_eq!(examples.keys().collect::<Vec<_>>(), reasons);
        assert!(examples.values().all(|m| !m.as_str().unwrap().is_empty()));
        assert!(model["greedy"]["acceptance_probability"].is_f64());
    }
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("eval.json")).unwrap()).unwrap();
    assert_eq!(written, report, "eval.json holds what was printed");
    assert!(out.join("eval.png").is_file());

    // Bad input is named.
    let output = arc_rec(&fixture.db.url)
        .args(["eval", "--run"])
        .arg(root.path().join("missing"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--run") && stderr.contains("not a run directory"),
        "{stderr}"
    );
    let output = arc_rec(&fixture.db.url)
        .args(["eval", "--n", "0", "--run"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("--n"));

    // --models picks models, in the run's order, and names one the run lacks.
    let only = |models: &str, run: &Path| {
        arc_rec(&fixture.db.url)
            .args(["eval", "--n", "2", "--max-prompts", "1", "--json"])
            .args(["--device", "cpu", "--models", models, "--run"])
            .arg(run)
            .output()
            .unwrap()
    };
    let output = only("rl,warmup", &out);
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = report["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["model"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["warmup", "rl"]);
    let unfinished = root.path().join("no-adapter");
    copy_dir(&out, &unfinished);
    std::fs::remove_dir_all(unfinished.join("adapter")).unwrap();
    let output = only("rl", &unfinished);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--models") && stderr.contains("no RL model"),
        "{stderr}"
    );
    let output = only("best", &out);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--models"));
}

/// Copies a directory tree.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
