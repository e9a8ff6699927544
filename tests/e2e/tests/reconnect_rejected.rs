//! The adapter's own connection refused after start-up: while the engine is away, another
//! worker takes the adapter's worker name (as a hostile guest could, through the engine), so
//! the adapter's reconnect is refused with `WORKER_NAMESPACE_CONFLICT`. The adapter must not
//! exit (its sandboxes and worker VMs would go with it): it serves again within seconds from
//! a standby connection, says so in `adapter::info.bus`, and takes its name back once the
//! other worker is gone. A connection the engine merely closes is the SDK's to reconnect; the
//! adapter counts it in `adapter::info.bus.reconnects`.

mod foundation_support;

use std::time::{Duration, Instant};

use e2e_tests::{bwrap_usable, Adapter, AdapterOptions, Client, Stack, CALL_TIMEOUT, PREFIX};
use foundation_support::{eventually, wait_ready, workers_named, Bare};
use serde_json::{json, Value};

/// How soon after the refusal the adapter must serve again.
const SERVES_AGAIN_WITHIN: Duration = Duration::from_secs(5);

async fn info(client: &Client, adapter: &Adapter) -> Value {
    client
        .invoke(&format!("{PREFIX}::adapter::info"), json!({}), CALL_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("adapter::info: {e:?}\n{}", adapter.log()))
}

/// `cat /tmp/mark` in the sandbox, or why not.
async fn read_mark(client: &Client, id: &str) -> Result<Value, String> {
    let read = json!({"sandbox_id": id, "argv": ["/bin/cat", "/tmp/mark"]});
    client
        .invoke(&format!("{PREFIX}::exec"), read, CALL_TIMEOUT)
        .await
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_adapter_survives_its_name_being_taken_and_takes_it_back() {
    if !bwrap_usable("the_adapter_survives_its_name_being_taken_and_takes_it_back") {
        return;
    }
    let name = "e2e-reconnect-rejected";
    let options = AdapterOptions {
        worker_name: name.into(),
        ..AdapterOptions::default()
    };
    let Stack {
        engine,
        client,
        mut adapter,
        state_dir: _state_dir,
    } = Stack::start(json!({}), options).await;
    let before = info(&client, &adapter).await;
    assert_eq!(before["bus"]["state"], "connected", "{before}");
    assert_eq!(before["bus"]["worker_name"], name, "{before}");
    let created = client
        .invoke(
            &format!("{PREFIX}::create"),
            json!({"image": "python"}),
            CALL_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("create: {e:?}\n{}", adapter.log()));
    let id = created["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();
    let write = json!({"sandbox_id": id, "argv": ["/bin/sh", "-c", "echo before > /tmp/mark"]});
    client
        .invoke(&format!("{PREFIX}::exec"), write, CALL_TIMEOUT)
        .await
        .expect("exec before the refusal");
    drop(client);

    // Every connection drops; the adapter's SDK waits 2 s before it connects again, and in
    // that time another worker announces the adapter's name.
    let engine = engine.restart().await.expect("restart the engine");
    let url = engine.url();
    let impostor = Client::connect(&url).await.expect("impostor");
    impostor.announce(name, None).expect("announce");
    let client = Client::connect(&url).await.expect("client");
    let holder = eventually(Duration::from_secs(2), || async {
        workers_named(&client, name).await.into_iter().next()
    })
    .await
    .expect("the impostor holds the name");
    assert_eq!(holder["pid"], std::process::id(), "{holder}");

    // The adapter's reconnect is refused: it says so, and serves again all the same.
    let refused = eventually(Duration::from_secs(20), || async {
        adapter
            .log()
            .contains("the engine refused this worker's connection")
            .then(Instant::now)
    })
    .await
    .unwrap_or_else(|| panic!("the adapter was never refused\n{}", adapter.log()));
    assert!(
        adapter.is_running(),
        "the adapter exited on the refusal\n{}",
        adapter.log()
    );
    let answer = eventually(SERVES_AGAIN_WITHIN + Duration::from_secs(1), || async {
        read_mark(&client, &id).await.ok()
    })
    .await
    .unwrap_or_else(|| panic!("the adapter does not serve again\n{}", adapter.log()));
    let took = refused.elapsed();
    assert!(took <= SERVES_AGAIN_WITHIN, "served again after {took:?}");
    assert_eq!(answer["stdout"], "before\n", "{answer}");

    let during = info(&client, &adapter).await;
    let bus = &during["bus"];
    assert_eq!(bus["state"], "name_conflict", "{during}");
    assert_eq!(bus["code"], "WORKER_NAMESPACE_CONFLICT", "{during}");
    assert_eq!(bus["held_by"], impostor.worker_id(), "{during}");
    assert!(bus["refusals"].as_u64() >= Some(1), "{during}");
    let standby = bus["serving_as"]
        .as_str()
        .unwrap_or_else(|| panic!("no standby named: {during}"))
        .to_string();
    assert!(standby.starts_with(&format!("{name}-standby-")), "{during}");
    let standbys = workers_named(&client, &standby).await;
    assert_eq!(standbys.len(), 1, "{standbys:?}");
    assert_eq!(standbys[0]["pid"], adapter.pid(), "{standbys:?}");
    // The name stays the impostor's while it lives.
    let holders = workers_named(&client, name).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["pid"], std::process::id(), "{holders:?}");

    // Once the impostor is gone, the adapter's next try (at most 30 s apart) gets the name.
    impostor.abort();
    let back = eventually(Duration::from_secs(45), || async {
        let now = info(&client, &adapter).await;
        (now["bus"]["state"] == "connected").then_some(now)
    })
    .await
    .unwrap_or_else(|| panic!("the adapter never got its name back\n{}", adapter.log()));
    assert!(back["bus"]["reconnects"].as_u64() >= Some(1), "{back}");
    assert!(back["bus"].get("serving_as").is_none(), "{back}");
    let holders = workers_named(&client, name).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["pid"], adapter.pid(), "{holders:?}");
    let standby_gone = eventually(Duration::from_secs(5), || async {
        workers_named(&client, &standby)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(standby_gone.is_some(), "the standby is still connected");
    let answer = read_mark(&client, &id)
        .await
        .unwrap_or_else(|e| panic!("exec under the name again: {e}\n{}", adapter.log()));
    assert_eq!(answer["stdout"], "before\n", "{answer}");
    client
        .invoke(
            &format!("{PREFIX}::stop"),
            json!({"sandbox_id": id, "wait": true}),
            CALL_TIMEOUT,
        )
        .await
        .expect("stop");
    let status = adapter.terminate().expect("the adapter stops on SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", adapter.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_connection_comes_back_and_is_counted() {
    let options = AdapterOptions {
        worker_name: "e2e-reconnect-counted".into(),
        ..AdapterOptions::default()
    };
    let Bare {
        engine,
        client,
        adapter,
        prefix,
        dir: _dir,
    } = Bare::start(json!({}), options).await;
    let before = info(&client, &adapter).await;
    assert_eq!(before["bus"]["state"], "connected", "{before}");
    assert_eq!(before["bus"]["reconnects"], 0, "{before}");
    drop(client);

    let engine = engine.restart().await.expect("restart the engine");
    let client = Client::connect(&engine.url()).await.expect("client");
    wait_ready(&client, &adapter, &prefix).await;
    let after = eventually(Duration::from_secs(10), || async {
        let now = info(&client, &adapter).await;
        (now["bus"]["state"] == "connected" && now["bus"]["reconnects"] == 1).then_some(now)
    })
    .await
    .unwrap_or_else(|| panic!("no reconnect counted\n{}", adapter.log()));
    assert_eq!(after["bus"]["refusals"], 0, "{after}");
    assert!(after["bus"].get("code").is_none(), "{after}");
}
