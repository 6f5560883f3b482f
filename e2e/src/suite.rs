//! A test runner for suites that share one fixture per test binary: the local control plane
//! ([`Env`]), or `make cluster`'s real node ([`crate::cluster::Cluster`]).
//!
//! libtest's harness gives no hook to stop shared servers at the end of a run, so e2e test
//! binaries use `harness = false` and this runner: the fixture starts lazily with the first test
//! that runs (none starts for `--list` or a filter that matches nothing) and is stopped, in order,
//! before the process exits. Output and exit code are libtest's.

use std::{future::Future, pin::Pin, process::ExitCode, sync::Arc};

use libtest_mimic::{Arguments, Failed, Trial};
use tokio::sync::OnceCell;

use crate::control_plane::Env;

pub type TestFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// What a test binary's tests share: started once, by the first test that runs.
pub trait Fixture: Sized + Send + Sync + 'static {
    fn start() -> impl Future<Output = anyhow::Result<Self>> + Send;
    /// The line logged once it is ready.
    fn ready(&self) -> String;
}

impl Fixture for Env {
    async fn start() -> anyhow::Result<Self> {
        Env::start().await
    }

    fn ready(&self) -> String {
        format!(
            "harness: control plane (etcd, kube-apiserver {}, kube-controller-manager, kube-scheduler, kwok nodes) and registry ready in {:.1} s",
            crate::tools::KUBERNETES_VERSION,
            self.boot_time().as_secs_f64()
        )
    }
}

/// One e2e test: an async function of the shared fixture.
pub struct Test<F = Env> {
    pub name: &'static str,
    pub run: fn(Arc<F>) -> TestFuture,
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

type Shared<F> = Arc<OnceCell<Result<Arc<F>, String>>>;

/// Runs one test named `name` that starts an environment of its own (its processes are that
/// environment's children, so no fixture is shared): a suite's `main` with `harness = false`.
pub fn run_alone<Fut>(name: &'static str, test: impl FnOnce() -> Fut + Send + 'static) -> ExitCode
where
    Fut: Future<Output = anyhow::Result<()>>,
{
    crate::init();
    let args = Arguments::from_args();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let trial = Trial::test(name, move || {
        runtime
            .block_on(test())
            .map_err(|e| Failed::from(format!("{e:#}")))
    });
    libtest_mimic::run(&args, vec![trial]).exit_code()
}

/// Runs the tests; `serial` for suites whose tests act cluster-wide and must not overlap (they
/// then run in the order given).
pub fn run_with<F: Fixture>(tests: Vec<Test<F>>, serial: bool) -> ExitCode {
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
    let env: Shared<F> = Arc::default();
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

async fn run_one<F: Fixture>(env: &Shared<F>, test: fn(Arc<F>) -> TestFuture) -> Result<(), Failed> {
    let env = env
        .get_or_init(|| async {
            match F::start().await {
                Ok(env) => {
                    eprintln!("{}", env.ready());
                    Ok(Arc::new(env))
                }
                // Started once per binary: every test reports the same failure without retrying.
                Err(e) => Err(format!("the suite's fixture failed to start: {e:#}")),
            }
        })
        .await
        .clone()?;
    test(env).await.map_err(|e| Failed::from(format!("{e:#}")))
}
