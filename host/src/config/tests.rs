use super::*;

fn text_origin() -> Origin {
    Origin::Text {
        name: "test.toml".into(),
        base_dir: PathBuf::from("/opt/sp"),
        search_deps: false,
    }
}

#[test]
fn embedded_default_is_valid() {
    let c = parse_str(DEFAULT_CONFIG, text_origin()).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.plugins[0].name.as_str(), "posix-shm");
    assert_eq!(
        c.plugins[0].paths[0],
        PathBuf::from("/opt/sp/libshardport_posix_shm.so")
    );
}

#[test]
fn ab_test_config_describes_its_split() {
    let c = parse_str(include_str!("../../../configs/ab-test.toml"), text_origin()).unwrap();
    // The second experiment ramps a new build of http (another instance of
    // the same transport) from 1% to 50%.
    let up = &c.experiments[1];
    assert_eq!(up.name, "http-build-upgrade");
    let ramp = up.ramp.as_ref().unwrap();
    assert_eq!(
        (ramp.arm, ramp.steps.clone(), ramp.interval),
        (
            1,
            vec![0.01, 0.05, 0.25, 0.5],
            std::time::Duration::from_secs(600)
        )
    );
    let next = c
        .plugins
        .iter()
        .find(|p| p.name.as_str() == "http-next")
        .unwrap();
    assert_eq!(next.transport.as_str(), "http");
    let g = up.guardrail.as_ref().unwrap();
    assert_eq!(g.cooldown, Some(std::time::Duration::from_secs(1800)));
    let e = &c.experiments[0];
    assert_eq!(
        (e.name.as_str(), e.unit),
        ("shm-vs-http", ExperimentUnit::Shard)
    );
    assert_eq!(e.salt, "2026-11-canary-1");
    assert_eq!(
        e.arms
            .iter()
            .map(|a| (a.name.as_str(), a.transport.as_str(), a.weight))
            .collect::<Vec<_>>(),
        [("control", "posix-shm", 95), ("canary", "http", 5)]
    );
    let g = e.guardrail.as_ref().unwrap();
    assert_eq!(
        (g.max_error_rate, g.max_p99_ratio, g.min_samples),
        (Some(0.02), Some(20.0), 200)
    );
    assert_eq!(g.window, std::time::Duration::from_secs(300));
    assert_eq!(
        (e.when.min_size, e.when.max_size, e.when.local),
        (Some(1 << 20), Some(64 << 20), Some(true))
    );
    let t = routing_table(&c);
    assert!(
        t.contains("shm-vs-http")
            && t.contains("control (control) via posix-shm 95.0%")
            && t.contains("canary via http 5.0%"),
        "{t}"
    );
}

#[test]
fn a_plugin_may_name_the_transport_its_library_implements() {
    let text = "[[plugin]]\nname = \"shm-next\"\ntransport = \"posix-shm\"\npath = \"n.so\"\n[[plugin]]\nname = \"posix-shm\"\npath = \"o.so\"\n";
    let c = parse_str(text, text_origin()).unwrap();
    let kinds: Vec<(&str, &str)> = c
        .plugins
        .iter()
        .map(|p| (p.name.as_str(), p.transport.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [("shm-next", "posix-shm"), ("posix-shm", "posix-shm")]
    );
    let e = parse_str(
        "[[plugin]]\nname = \"x\"\ntransport = \"Bad Name\"\npath = \"n.so\"\n",
        text_origin(),
    )
    .unwrap_err();
    assert!(e.message.contains("plugin[0].transport"), "{e}");
}

#[test]
fn experiment_errors_name_the_key() {
    let base =
        "[[plugin]]\nname = \"a\"\npath = \"a.so\"\n[[plugin]]\nname = \"b\"\npath = \"b.so\"\n";
    let cases = [
        ("arms = [{ transport = \"a\", weight = 1 }]", "`experiment[0].arms`: expected 2..=16 arms"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"a\", weight = 1 }]", "`experiment[0].arms[1].transport`: `a` already has an arm"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = -1 }]", "`experiment[0].arms[1].weight`: expected an integer in 0..=1000000, found -1"),
        ("arms = [{ transport = \"a\", weight = 0 }, { transport = \"b\", weight = 0 }]", "`experiment[0].arms`: every arm has weight 0"),
        ("arms = [{ transport = \"a\", weight = 0 }, { transport = \"b\", weight = 5 }]\nramp = { steps = [5], interval = \"1m\" }", "`experiment[0].arms`: every arm but the ramped one has weight 0"),
        ("unit = \"request\"\narms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]", "`experiment[0].unit`: expected \"shard\" or \"fetch\", found \"request\""),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { window = \"1m\" }", "`experiment[0].guardrail` sets neither"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { max-error-rate = 1.5 }", "`experiment[0].guardrail.max-error-rate`: expected a number in 0..=1, found 1.5"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { max-error-rate = 0.1, window = \"soon\" }", "`experiment[0].guardrail.window`: expected a duration"),
        ("min-size = \"2MiB\"\nmax-size = \"1MiB\"\narms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]", "`experiment[0]`: max-size (1048576) is below min-size (2097152)"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { max-error-rate = 0.1, cooldown = \"10m\", max-cooldown = \"1m\" }", "`experiment[0].guardrail.max-cooldown` (60s) is shorter than `cooldown` (600s)"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { max-error-rate = 0.1, probe-share = 0.0 }", "`experiment[0].guardrail.probe-share`: expected a number in 0.0001..=1"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nramp = { arm = \"a\", steps = [1, 5], interval = \"1m\" }", "`experiment[0].ramp.arm`: `a` is the control arm"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nramp = { arm = \"c\", steps = [1, 5], interval = \"1m\" }", "`experiment[0].ramp.arm`: no arm `c` (arms: a, b)"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nramp = { steps = [5, 5], interval = \"1m\" }", "`experiment[0].ramp.steps[1]`: expected a percentage above 5 and at most 100"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nramp = { steps = [50, 101], interval = \"1m\" }", "`experiment[0].ramp.steps[1]`"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nramp = { steps = [], interval = \"1m\" }", "`experiment[0].ramp.steps`: expected 1..=16 percentages, found 0"),
        ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nramp = { steps = [1], interval = \"never\" }", "`experiment[0].ramp.interval`: expected a duration"),
    ];
    for (body, want) in cases {
        let text = format!("{base}[[experiment]]\nname = \"x\"\n{body}\n");
        let err = parse_str(&text, text_origin()).unwrap_err();
        assert!(err.message.contains(want), "{body}\n-> {err}");
        assert!(err.line > 0, "{err}");
    }
    // Two experiments with one name.
    let arms = "arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]";
    let text = format!(
        "{base}[[experiment]]\nname = \"x\"\n{arms}\n[[experiment]]\nname = \"x\"\n{arms}\n"
    );
    let err = parse_str(&text, text_origin()).unwrap_err();
    assert!(
        err.message
            .contains("`experiment[1].name`: `x` is used twice"),
        "{err}"
    );
    // An arm whose transport no plugin loads is a warning, not an error.
    let text = format!("{base}[[experiment]]\nname = \"x\"\narms = [{{ transport = \"a\", weight = 1 }}, {{ transport = \"c\", weight = 1 }}]\n");
    let c = parse_str(&text, text_origin()).unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("`experiment[0].arms[1].transport` names `c`")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn shipped_configs_are_valid_without_warnings() {
    for (name, text) in [
        (
            "single-node.toml",
            include_str!("../../../configs/single-node.toml"),
        ),
        (
            "multi-node.toml",
            include_str!("../../../configs/multi-node.toml"),
        ),
        (
            "ab-test.toml",
            include_str!("../../../configs/ab-test.toml"),
        ),
    ] {
        let c = parse_str(text, text_origin()).unwrap_or_else(|e| panic!("{name}:\n{e}"));
        assert!(c.warnings.is_empty(), "{name}: {:?}", c.warnings);
        assert!(!c.routes.is_empty(), "{name}");
    }
}

#[test]
fn bad_choice_points_at_the_value() {
    let text = "[fetch]\nmode = \"fast\"\n";
    let e = parse_str(text, text_origin()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`fetch.mode`: expected \"view\" or \"copy\", found \"fast\"\n \
         --> test.toml:2:8\n  |\n2 | mode = \"fast\"\n  |        ^^^^^^\n  = help: example: mode = \"view\""
    );
}

#[test]
fn syntax_error_has_position() {
    let e = parse_str("[fetch\nmode = 1", text_origin()).unwrap_err();
    assert_eq!((e.line, e.col), (1, 7));
    assert!(e.message.starts_with("invalid TOML"), "{}", e.message);
}

#[test]
fn wrong_type_has_position() {
    let e = parse_str("[fetch]\nverify-checksum = \"yes\"\n", text_origin()).unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("invalid type"), "{}", e.message);
}

#[test]
fn unknown_keys_are_warned_with_dotted_path_and_place() {
    let c = parse_str(
        "[fetch]\nmod = \"view\"\n[[plugin]]\nname = \"x\"\npath = \"a.so\"\n  colour = 1\n[plugin.config]\nanything = 1\n[fecth]\nmode = \"view\"\n",
        text_origin(),
    )
    .unwrap();
    assert_eq!(
        c.warnings,
        vec![
            "unknown config key `fetch.mod` (ignored) at test.toml:2:1".to_owned(),
            "unknown config key `plugin[0].colour` (ignored) at test.toml:6:3".to_owned(),
            "unknown config key `fecth` (ignored) at test.toml:9:2".to_owned(),
        ]
    );
    assert_eq!(c.plugins[0].config_text, "anything = 1\n");
    // A key written as a dotted key, and one inside an inline table.
    let c = parse_str(
        "fetch.mdoe = \"view\"\nnode = { nmae = \"a\" }\n",
        text_origin(),
    )
    .unwrap();
    assert_eq!(
        c.warnings,
        vec![
            "unknown config key `fetch.mdoe` (ignored) at test.toml:1:7".to_owned(),
            "unknown config key `node.nmae` (ignored) at test.toml:2:10".to_owned(),
        ]
    );
}

#[test]
fn pool_storage_needs_a_transport() {
    let e = parse_str("[put]\nstorage = \"pool\"\n", text_origin()).unwrap_err();
    assert!(
        e.message.contains("needs `put.pool-transport`"),
        "{}",
        e.message
    );
    assert_eq!(e.line, 2);
}

#[test]
fn duplicate_plugin_and_bad_names() {
    let dup =
        "[[plugin]]\nname = \"a\"\npath = \"a.so\"\n[[plugin]]\nname = \"a\"\npath = \"b.so\"\n";
    let e = parse_str(dup, text_origin()).unwrap_err();
    assert_eq!(
        e.message,
        "`plugin[1].name`: plugin `a` is configured twice"
    );
    assert_eq!(e.line, 5);
    let bad = "[[plugin]]\nname = \"Posix_Shm\"\npath = \"a.so\"\n";
    let e = parse_str(bad, text_origin()).unwrap_err();
    assert!(e
        .message
        .starts_with("`plugin[0].name`: `Posix_Shm` is not a transport name"));
    let sha = "[[plugin]]\nname = \"a\"\npath = \"a.so\"\nsha256 = \"abc\"\n";
    let e = parse_str(sha, text_origin()).unwrap_err();
    assert_eq!(
        e.message,
        "`plugin[0].sha256`: expected 64 hexadecimal digits"
    );
}

#[test]
fn empty_export_list_and_bad_sizes_are_errors() {
    let e = parse_str("[put]\nexport-to = []\n", text_origin()).unwrap_err();
    assert!(
        e.message.starts_with("`put.export-to` is empty"),
        "{}",
        e.message
    );
    let e = parse_str("[node]\nmax-shard-size = \"huge\"\n", text_origin()).unwrap_err();
    assert_eq!(
        e.message,
        "`node.max-shard-size`: expected a positive byte size such as \"64GiB\", found \"huge\""
    );
    assert_eq!((e.line, e.col), (2, 18));
    let c = parse_str("[node]\nmax-shard-size = \"2GiB\"\n", text_origin()).unwrap();
    assert_eq!(c.node.max_shard_size, 2 << 30);
}

#[test]
fn routes_are_validated_and_kept_in_order() {
    let text = "[[plugin]]\nname = \"posix-shm\"\npath = \"a.so\"\n[[plugin]]\nname = \"http\"\npath = \"b.so\"\n\
                [[route]]\nname = \"big-local\"\nlocal = true\nmin-size = \"1MiB\"\ntransports = [\"posix-shm\", \"http\"]\n\
                [[route]]\nowner = \"10.0.*\"\ntags = { role = \"kv\" }\ntransports = [\"http\"]\n";
    let c = parse_str(text, text_origin()).unwrap();
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[0].name, "big-local");
    assert_eq!(c.routes[0].when.min_size, Some(1 << 20));
    assert_eq!(c.routes[1].name, "route[1]");
    assert!(c.routes[1]
        .when
        .owner
        .as_ref()
        .unwrap()
        .matches("10.0.3.4:7070"));
    assert_eq!(c.same_node, SameNodeMatch::Both);

    let e = parse_str("[[route]]\ntransports = []\n", text_origin()).unwrap_err();
    assert_eq!((e.line, e.col), (2, 14));
    assert!(e.message.starts_with("`route[0].transports` is empty"));
    let e = parse_str(
        "[[route]]\nmin-size = \"2MiB\"\nmax-size = \"1MiB\"\ntransports = [\"x\"]\n",
        text_origin(),
    )
    .unwrap_err();
    assert!(e.message.contains("could never match"), "{}", e.message);
    let e = parse_str(
        "[[route]]\ndevice = \"tpu\"\ntransports = [\"x\"]\n",
        text_origin(),
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "`route[0].device`: expected \"cpu\" or \"cuda\", found \"tpu\""
    );
}

#[test]
fn routing_table_lists_routes_then_the_default() {
    let c = parse_str(
        include_str!("../../../configs/multi-node.toml"),
        text_origin(),
    )
    .unwrap();
    let t = routing_table(&c);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 5, "{t}");
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["1.", "same-machine", "local", "->", "posix-shm,", "http"]
    );
    assert!(lines[2].contains("tag kind=kv, owner ~ 10.0.1.*"), "{t}");
    assert!(lines[4].trim_start().starts_with("4. default"), "{t}");
}

#[test]
fn address_globs() {
    let p = |s: &str| AddrPattern(s.to_owned());
    assert!(p("*").matches("anything:1"));
    assert!(p("10.0.?.*:7070").matches("10.0.5.12:7070"));
    assert!(!p("10.0.?.*:7070").matches("10.0.55.12:7070"));
    assert!(!p("10.*").matches("110.0.0.1:1"));
    assert!(p("*:7070").matches("[::1]:7070"));
    assert!(!p("a*b*c").matches(&"ab".repeat(1000)));
}

#[test]
fn cache_policies_combine_and_need_their_parameters() {
    let c = parse_str(
        "[cache]\npolicy = [\"lru\", \"ttl\"]\nmax-bytes = \"1GiB\"\nttl = \"30s\"\n",
        text_origin(),
    )
    .unwrap();
    assert_eq!(
        c.cache,
        crate::vocab::CachePolicy {
            enabled: true,
            max_bytes: Some(1 << 30),
            ttl: Some(std::time::Duration::from_secs(30))
        }
    );
    let e = parse_str("[cache]\npolicy = \"lru\"\n", text_origin()).unwrap_err();
    assert_eq!(
        e.message,
        "`cache.policy` includes \"lru\", which needs `cache.max-bytes`"
    );
    assert_eq!((e.line, e.col), (2, 10));
    let e = parse_str("[cache]\npolicy = \"ttl\"\nttl = \"soon\"\n", text_origin()).unwrap_err();
    assert!(
        e.message.starts_with("`cache.ttl`: expected a duration"),
        "{}",
        e.message
    );
    let e = parse_str("[cache]\npolicy = [\"none\", \"lru\"]\n", text_origin()).unwrap_err();
    assert!(e.message.contains("\"none\" stands alone"), "{}", e.message);
    assert!(!parse_str("", text_origin()).unwrap().cache.enabled);
    assert_eq!(
        parse_duration("250ms"),
        Some(std::time::Duration::from_millis(250))
    );
    assert_eq!(
        parse_duration("2h"),
        Some(std::time::Duration::from_secs(7200))
    );
    assert_eq!(parse_duration("5 parsecs"), None);
}

#[test]
fn an_unnamed_node_is_marked_so() {
    let c = parse_str("[node]\nadvertise = \"127.0.0.1:0\"\n", text_origin()).unwrap();
    assert!(!c.node.name_given);
    assert_eq!(c.node.name, UNNAMED_NODE);
    let c = parse_str("[node]\nname = \"a\"\n", text_origin()).unwrap();
    assert!(c.node.name_given && c.node.name == "a");
    // The library config names no node and fixes no port; the demo's does.
    let lib = parse_str(LIBRARY_CONFIG, text_origin()).unwrap();
    assert!(!lib.node.name_given);
    assert!(lib.node.advertise.ends_with(":0"), "{}", lib.node.advertise);
    assert_eq!(
        parse_str(DEFAULT_CONFIG, text_origin()).unwrap().node.name,
        "demo"
    );
}

#[test]
fn advertise_is_checked() {
    let e = parse_str("[node]\nadvertise = \"nohost\"\n", text_origin()).unwrap_err();
    assert_eq!(
        e.message,
        "`node.advertise`: expected `host:port` of at most 255 bytes, found \"nohost\""
    );
    let c = parse_str("[node]\nadvertise = \"[::1]:7070\"\n", text_origin()).unwrap();
    assert_eq!(c.node.advertise, "[::1]:7070");
}

#[test]
fn relative_plugin_paths_resolve_against_the_config_file() {
    let c = parse_str(
        "[[plugin]]\nname = \"a\"\npath = \"lib/a.so\"\n",
        Origin::File(PathBuf::from("/etc/sp/node.toml")),
    )
    .unwrap();
    assert_eq!(c.plugins[0].paths, vec![PathBuf::from("/etc/sp/lib/a.so")]);
}
