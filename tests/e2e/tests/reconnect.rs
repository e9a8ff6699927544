//! The adapter and the engine over time: a second adapter under the same worker name is
//! refused while the first keeps serving, and an engine that goes away and comes back finds
//! the same adapter process serving again, its configuration and sandboxes intact.

mod foundation_support;

use std::time::Duration;

use e2e_tests::{
    bwrap_usable, Adapter, AdapterOptions, Client, PluginKind, Stack, CALL_TIMEOUT, PREFIX,
};
use foundation_support::{
    assert_refused, eventually, exit_of, local_config, wait_ready, workers_named, Bare,
};
use iii_test_engine::Engine;
use serde_json::{json, Value};

async fn info_of(client: &Client, function_id: &str) -> Value {
    client
        .invoke(
            "engine::functions::info",
            json!({ "function_id": function_id }),
            CALL_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("{function_id}: {e:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_adapter_under_the_same_name_is_refused_and_the_first_keeps_serving() {
    let name = "e2e-duplicate-name";
    let first_options = AdapterOptions {
        worker_name: name.into(),
        ..AdapterOptions::default()
    };
    let bare = Bare::start(json!({}), first_options.clone()).await;
    let owner_before =
        info_of(&bare.client, "sandbox-libkrun::adapter::info").await["worker_id"].clone();
    // Wait until the engine knows the first worker's name, or there is nothing to conflict with.
    eventually(Duration::from_secs(30), || async {
        (!workers_named(&bare.client, name).await.is_empty()).then_some(())
    })
    .await
    .expect("the first adapter is listed under its name");

    for (case, prefix, plugin) in [
        ("same prefix", Some(PREFIX.to_string()), PluginKind::Bwrap),
        (
            "other prefix",
            Some("elsewhere".to_string()),
            PluginKind::Bwrap,
        ),
        ("other plugin", None, PluginKind::Libkrun),
    ] {
        let options = AdapterOptions {
            prefix,
            plugin,
            ..first_options.clone()
        };
        let mut second = Adapter::spawn(&bare.engine.url(), &options);
        let status = exit_of(&mut second);
        let log = second.log();
        assert_refused(
            status,
            &log,
            3,
            &["refused", "WORKER_NAMESPACE_CONFLICT"],
            case,
        );
        // The first keeps its name, its functions, and serves.
        let workers = workers_named(&bare.client, name).await;
        assert_eq!(workers.len(), 1, "{case}: {workers:?}");
        assert_eq!(workers[0]["pid"], bare.adapter.pid(), "{case}: {workers:?}");
        let owner =
            info_of(&bare.client, "sandbox-libkrun::adapter::info").await["worker_id"].clone();
        assert_eq!(owner, owner_before, "{case}");
        let info = bare
            .call("adapter::info", json!({}))
            .await
            .unwrap_or_else(|e| panic!("{case}: first adapter: {e:?}\n{}", bare.adapter.log()));
        assert_eq!(info["adapter"], "sandbox-bwrap", "{case}: {info}");
        let listed = bare.call("list", json!({})).await.expect("list");
        assert_eq!(listed["cap"], 32, "{case}: {listed}");
    }
    assert!(
        !workers_named(&bare.client, name).await.is_empty()
            && !bare.adapter.log().contains("refused"),
        "the first adapter was never refused:\n{}",
        bare.adapter.log()
    );
}

/// After the engine came back: the same process serves again under its name, with the
/// configuration it read at start-up (`cap`), not the one the new engine holds.
async fn serves_again(
    url: &str,
    adapter: &mut Adapter,
    worker_name: &str,
    adapter_name: &str,
    cap: u64,
) -> Client {
    assert!(
        adapter.is_running(),
        "the adapter must not exit when the engine goes\n{}",
        adapter.log()
    );
    let client = Client::connect(url)
        .await
        .expect("client to the new engine");
    wait_ready(&client, adapter, "sandbox-libkrun").await;
    let info = client
        .invoke("sandbox-libkrun::adapter::info", json!({}), CALL_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("adapter::info after the restart: {e:?}\n{}", adapter.log()));
    assert_eq!(info["adapter"], adapter_name, "{info}");
    let listed = client
        .invoke("sandbox-libkrun::list", json!({}), CALL_TIMEOUT)
        .await
        .expect("list after the restart");
    assert_eq!(
        listed["cap"], cap,
        "configuration read once at start-up: {listed}"
    );
    let workers = eventually(Duration::from_secs(30), || async {
        let found = workers_named(&client, worker_name).await;
        (!found.is_empty()).then_some(found)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "not listed as {worker_name} after the restart\n{}",
            adapter.log()
        )
    });
    assert_eq!(workers.len(), 1, "{workers:?}");
    assert_eq!(
        workers[0]["pid"],
        adapter.pid(),
        "same process: {workers:?}"
    );
    client
}

#[tokio::test(flavor = "multi_thread")]
async fn the_adapter_reconnects_when_the_engine_restarts_and_serves_again() {
    let worker_name = "e2e-reconnect";
    let options = AdapterOptions {
        plugin: PluginKind::Libkrun,
        prefix: None,
        worker_name: worker_name.into(),
        ..AdapterOptions::default()
    };
    let Bare {
        engine,
        client,
        mut adapter,
        dir,
        ..
    } = Bare::start(json!({"max_concurrent_sandboxes": 5}), options.clone()).await;
    let addr = engine.addr();
    let url = engine.url();
    let pid = adapter.pid();
    drop(client);

    // At once: the engine drops every connection and listens again on the same address.
    let engine = engine.restart().await.expect("restart the engine");
    let client = serves_again(&url, &mut adapter, worker_name, "sandbox-libkrun", 5).await;
    drop(client);

    // Down for a while, then back with another value in the entry: the adapter retries, and
    // keeps the configuration it started with (a change applies on the adapter's restart).
    engine.shutdown().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let engine = Engine::with_config(
        options.config_name.clone(),
        local_config(dir.path(), json!({"max_concurrent_sandboxes": 7})),
    )
    .start(addr)
    .await
    .expect("start the engine again");
    let _client = serves_again(
        &engine.url(),
        &mut adapter,
        worker_name,
        "sandbox-libkrun",
        5,
    )
    .await;
    assert_eq!(adapter.pid(), pid);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_created_before_the_engine_restart_still_execs() {
    if !bwrap_usable("a_sandbox_created_before_the_engine_restart_still_execs") {
        return;
    }
    let Stack {
        engine,
        client,
        mut adapter,
        state_dir: _state_dir,
    } = Stack::start(
        json!({"max_concurrent_sandboxes": 4}),
        AdapterOptions::default(),
    )
    .await;
    let created = client
        .invoke(
            "sandbox-libkrun::create",
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
        .invoke("sandbox-libkrun::exec", write, CALL_TIMEOUT)
        .await
        .expect("exec before the restart");
    drop(client);

    let engine = engine.restart().await.expect("restart the engine");
    let client = serves_again(
        &engine.url(),
        &mut adapter,
        "sandbox-libkrun",
        "sandbox-bwrap",
        4,
    )
    .await;
    let read = json!({"sandbox_id": id, "argv": ["/bin/cat", "/tmp/mark"]});
    let answer = client
        .invoke("sandbox-libkrun::exec", read, CALL_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("exec after the restart: {e:?}\n{}", adapter.log()));
    assert_eq!(answer["stdout"], "before\n", "{answer}");
    let listed = client
        .invoke("sandbox-libkrun::list", json!({}), CALL_TIMEOUT)
        .await
        .expect("list");
    assert_eq!(listed["in_flight"], 1, "{listed}");
    assert_eq!(
        listed["sandboxes"][0]["sandbox_id"],
        id.as_str(),
        "{listed}"
    );
    client
        .invoke(
            "sandbox-libkrun::stop",
            json!({"sandbox_id": id, "wait": true}),
            CALL_TIMEOUT,
        )
        .await
        .expect("stop");
}
