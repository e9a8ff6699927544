//! Trigger types through the test engine as the official `iii-sdk` uses them: a provider's
//! `register_trigger_type`, a subscriber's `register_trigger` reaching the provider's handler
//! (also when it arrives first), its unregister and its disconnect; a refusal from the
//! provider reaching a raw subscriber.

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, sdk_worker};
use iii_sdk::protocol::RegisterTriggerInput;
use iii_sdk::trigger::{TriggerConfig, TriggerHandler};
use iii_sdk::{Error, IIIClient, RegisterTriggerType};
use iii_test_engine::client::Client;
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};

const TYPE: &str = "demo::event";

async fn engine() -> EngineHandle {
    Engine::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("engine starts")
}

/// What the provider's handler saw: `("register", id, function_id, config)` or
/// `("unregister", id, "", null)`.
type Seen = Arc<Mutex<Vec<(&'static str, String, String, Value)>>>;

struct Recorder(Seen);

type Answer<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;

// The methods `async_trait` would generate; this crate does not otherwise need it.
impl TriggerHandler for Recorder {
    fn register_trigger<'life0, 'async_trait>(
        &'life0 self,
        config: TriggerConfig,
    ) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let refuse = config.config.get("refuse").is_some();
            self.0
                .lock()
                .unwrap()
                .push(("register", config.id, config.function_id, config.config));
            if refuse {
                return Err(Error::Handler("S001 this config is refused".into()));
            }
            Ok(())
        })
    }

    fn unregister_trigger<'life0, 'async_trait>(
        &'life0 self,
        config: TriggerConfig,
    ) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            self.0
                .lock()
                .unwrap()
                .push(("unregister", config.id, String::new(), Value::Null));
            Ok(())
        })
    }
}

fn provide(owner: &IIIClient) -> Seen {
    let seen: Seen = Arc::default();
    #[allow(deprecated)]
    let _ = owner.register_trigger_type(RegisterTriggerType::new(
        TYPE,
        "demo",
        Recorder(Arc::clone(&seen)),
    ));
    seen
}

async fn seen_where(
    seen: &Seen,
    what: &str,
    test: impl Fn(&[(&'static str, String, String, Value)]) -> bool,
) {
    eventually(what, || async { test(&seen.lock().unwrap()).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_reaches_its_provider_and_goes_on_unregister_and_disconnect() {
    let engine = engine().await;
    let owner = sdk_worker(&engine.url(), "provider", None);
    let seen = provide(&owner);
    eventually("the type on the engine", || async {
        (engine.trigger_counts().0 == 1).then_some(())
    })
    .await;
    let subscriber = sdk_worker(&engine.url(), "subscriber", None);
    #[allow(deprecated)]
    let first = subscriber
        .register_trigger(RegisterTriggerInput::new(
            TYPE,
            "sub::on",
            json!({"kinds": ["a"]}),
        ))
        .expect("register");
    #[allow(deprecated)]
    let _second = subscriber
        .register_trigger(RegisterTriggerInput::new(TYPE, "sub::other", json!({})))
        .expect("register");
    seen_where(&seen, "both bindings at the provider", |s| s.len() == 2).await;
    let bound = seen.lock().unwrap().clone();
    let first_seen = bound
        .iter()
        .find(|s| s.2 == "sub::on")
        .expect("sub::on bound");
    assert_eq!(first_seen.0, "register");
    assert_eq!(first_seen.3, json!({"kinds": ["a"]}));
    let first_id = first_seen.1.clone();

    first.unregister();
    seen_where(&seen, "the unregister", |s| {
        s.iter().any(|e| e.0 == "unregister" && e.1 == first_id)
    })
    .await;
    subscriber.shutdown_async().await;
    seen_where(&seen, "the disconnect's unregister", |s| {
        s.iter().filter(|e| e.0 == "unregister").count() == 2
    })
    .await;
    eventually("no binding left", || async {
        (engine.trigger_counts().1 == 0).then_some(())
    })
    .await;
    owner.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_made_before_its_provider_reaches_it_and_a_refusal_reaches_the_subscriber() {
    let engine = engine().await;
    let subscriber = Client::connect(&engine.url()).await.expect("connect");
    subscriber
        .send(
            json!({"type": "registertrigger", "id": "early", "trigger_type": TYPE,
                     "function_id": "raw::on", "config": {}}),
        )
        .expect("send");
    eventually("the parked binding", || async {
        (engine.trigger_counts().1 == 1).then_some(())
    })
    .await;
    let owner = sdk_worker(&engine.url(), "late-provider", None);
    let seen = provide(&owner);
    seen_where(&seen, "the early binding", |s| {
        s.iter().any(|e| e.1 == "early")
    })
    .await;

    subscriber
        .send(
            json!({"type": "registertrigger", "id": "bad", "trigger_type": TYPE,
                     "function_id": "raw::on", "config": {"refuse": true}}),
        )
        .expect("send");
    let result = subscriber
        .next_of_type("triggerregistrationresult", Duration::from_secs(20))
        .await
        .expect("the provider's refusal, forwarded");
    assert_eq!(result["id"], "bad");
    assert_eq!(result["trigger_type"], TYPE);
    let message = result["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("S001 this config is refused"), "{result}");
    owner.shutdown_async().await;
    engine.shutdown().await;
}
