//! A test runner for suites that share one control plane per test binary.
//!
//! libtest's harness gives no hook to stop shared servers at the end of a run, so e2e test
//! binaries use `harness = false` and this runner: the control plane boots lazily with the first
//! test that runs (none boots for `--list` or a filter that matches nothing) and is stopped, in
//! order, before the process exits. Output and exit code are libtest's.

use std::{future::Future, pin::Pin, process::ExitCode, sync::Arc};

use libtest_mimic::{Arguments, Failed, Trial};
use tokio::sync::OnceCell;

use crate::control_plane::Env;

pub type TestFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// One e2e test: an async function of the shared environment.
pub struct Test {
    pub name: &'static str,
    pub run: fn(Arc<Env>) -> TestFuture,
}

/// Declares the test binary's `main` from a list of `async fn(Arc<Env>) -> anyhow::Result<()>`.
#[macro_export]
macro_rules! e2e_main {
    (serial: $($test:ident),+ $(,)?) => {
        fn main() -> std::process::ExitCode {
            $crate::suite::run_with(vec![$(
                $crate::suite::Test { name: stringify!($test), run: |env| Box::pin($test(env)) }
            ),+], true)
        }
    };
    ($($test:ident),+ $(,)?) => {
        fn main() -> std::process::ExitCode {
            $crate::suite::run_with(vec![$(
                $crate::suite::Test { name: stringify!($test), run: |env| Box::pin($test(env)) }
            ),+], false)
        }
    };
}

type SharedEnv = Arc<OnceCell<Result<Arc<Env>, String>>>;

/// Runs the tests; `serial` for suites whose tests act cluster-wide and must not overlap.
pub fn run_with(tests: Vec<Test>, serial: bool) -> ExitCode {
    crate::init();
    let mut args = Arguments::from_args();
    if serial {
        args.test_threads = Some(1);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => Arc::new(rt),
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let env: SharedEnv = Arc::default();
    let trials = tests
        .into_iter()
        .map(|test| {
            let (runtime, env) = (runtime.clone(), env.clone());
            Trial::test(test.name, move || runtime.block_on(run_one(&env, test.run)))
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // Stop the servers before the runtime: its worker threads are their parent-death anchor.
    drop(env);
    drop(runtime);
    conclusion.exit_code()
}

async fn run_one(env: &SharedEnv, test: fn(Arc<Env>) -> TestFuture) -> Result<(), Failed> {
    let env = env
        .get_or_init(|| async {
            match Env::start().await {
                Ok(env) => {
                    eprintln!(
                        "harness: control plane (etcd, kube-apiserver {}, kube-controller-manager, kube-scheduler, kwok nodes) and registry ready in {:.1} s",
                        crate::tools::KUBERNETES_VERSION,
                        env.boot_time().as_secs_f64()
                    );
                    Ok(Arc::new(env))
                }
                // Booted once per binary: every test reports the same failure without retrying.
                Err(e) => Err(format!("local control plane failed to start: {e:#}")),
            }
        })
        .await
        .clone()?;
    test(env).await.map_err(|e| Failed::from(format!("{e:#}")))
}
