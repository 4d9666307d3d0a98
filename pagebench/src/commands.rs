//! The commands `prepare`, `getpage` and `ingest`.

use super::*;

pub(crate) async fn prepare(endpoint: Arc<Endpoint>, args: PrepareArgs) -> anyhow::Result<bool> {
    let PageArgs { keys, value_size } = args.pages;
    if keys == 0 || args.batch_size == 0 {
        bail!("--keys and --batch-size must be at least 1");
    }
    let mut conn = Connection::new(endpoint.clone());
    let tenant = match args.tenant {
        Some(tenant) => tenant,
        None => conn.create_tenant().await?,
    };
    let (timeline, last) = conn.create_timeline(tenant).await?;
    let path = timeline_path(tenant, timeline);
    let ingest_path = format!("{path}/ingest");

    let started = Instant::now();
    let mut lsn = last
        .checked_add(lsn_step(value_size))
        .context("the LSN overflowed")?;
    let mut key = 0;
    let batch_keys = u32::try_from(args.batch_size).unwrap_or(u32::MAX);
    while key < keys {
        let count = batch_keys.min(keys - key);
        let batch = build_batch(lsn, key, usize::try_from(count)?, keys, value_size)?;
        let (status, body) = conn
            .exchange(Method::POST, &ingest_path, Some((batch.body, OCTET_STREAM)))
            .await?;
        if status != StatusCode::OK {
            bail!(
                "ingest into {path} at key {key}: {}",
                describe_failure(status, &body)
            );
        }
        lsn = batch
            .last_lsn
            .checked_add(lsn_step(value_size))
            .context("the LSN overflowed")?;
        key += count;
    }
    let ingest_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let info = conn
        .call(
            Method::PUT,
            &format!("{path}/checkpoint"),
            None,
            StatusCode::OK,
        )
        .await?;
    let checkpoint_s = started.elapsed().as_secs_f64();
    let last_record_lsn: Lsn = parse_field(&info, "last_record_lsn")?;
    let disk_consistent_lsn: Lsn = parse_field(&info, "disk_consistent_lsn")?;
    // Precision loss irrelevant: a rate.
    let mib_per_sec = (f64::from(keys) * value_size as f64) / MIB / ingest_s;
    if args.json {
        println!(
            "{}",
            json!({
                "tenant_id": tenant.to_string(),
                "timeline_id": timeline.to_string(),
                "keys": keys,
                "value_size": value_size,
                "batch_size": args.batch_size,
                "last_record_lsn": last_record_lsn.to_string(),
                "disk_consistent_lsn": disk_consistent_lsn.to_string(),
                "ingest_s": round(ingest_s, 3),
                "checkpoint_s": round(checkpoint_s, 3),
                "mb_per_sec": round(mib_per_sec, 2),
            })
        );
    } else {
        println!("tenant   {tenant}");
        println!("timeline {timeline}");
        println!(
            "{keys} pages of {value_size} bytes in {ingest_s:.2} s ({mib_per_sec:.1} MiB/s, \
             batches of {}), checkpoint {checkpoint_s:.2} s, last_record_lsn {last_record_lsn}, \
             disk_consistent_lsn {disk_consistent_lsn}",
            args.batch_size
        );
        println!(
            "next: pagebench getpage --endpoint {} --tenant {tenant} --timeline {timeline} \
             --keys {keys} --value-size {value_size} --clients 1",
            endpoint_url(&endpoint)
        );
    }
    Ok(true)
}

pub(crate) fn endpoint_url(endpoint: &Endpoint) -> String {
    format!("http://{}", endpoint.authority)
}

pub(crate) async fn getpage(endpoint: Arc<Endpoint>, args: GetPageArgs) -> anyhow::Result<bool> {
    check_run_args(&args.run, &args.pages)?;
    let path = timeline_path(args.tenant, args.timeline);
    // A missing timeline is one clear error rather than a run of 404s.
    Connection::new(endpoint.clone())
        .call(Method::GET, &path, None, StatusCode::OK)
        .await?;
    let prefix = format!("{path}/page?lsn={}&key=", args.lsn);
    let works = (0..args.run.clients)
        .map(|client| Work::GetPage {
            prefix: prefix.clone(),
            keys: args.pages.keys,
            value_size: args.pages.value_size,
            rng: fastrand::Rng::with_seed(args.seed.wrapping_add(client as u64)),
        })
        .collect();
    let main = run_phase("getpage", &endpoint, works, &args.run).await?;
    let baseline = status_baseline(&endpoint, &args.run).await?;
    let mut details = Map::new();
    details.insert("keys".into(), json!(args.pages.keys));
    details.insert("value_size".into(), json!(args.pages.value_size));
    details.insert("lsn".into(), json!(args.lsn.to_string()));
    details.insert("seed".into(), json!(args.seed));
    let report = Report {
        scenario: "getpage",
        clients: args.run.clients,
        main,
        baseline,
        details,
    };
    Ok(report.print(args.run.json))
}

pub(crate) async fn ingest(endpoint: Arc<Endpoint>, args: IngestArgs) -> anyhow::Result<bool> {
    check_run_args(&args.run, &args.pages)?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if args.timelines.len() > args.run.clients {
        bail!(
            "{} timelines for {} clients: each client ingests into one timeline",
            args.timelines.len(),
            args.run.clients
        );
    }
    let mut conn = Connection::new(endpoint.clone());
    let tenant = match args.tenant {
        Some(tenant) => tenant,
        None => conn.create_tenant().await?,
    };
    let mut timelines = args.timelines.clone();
    for timeline in &timelines {
        // A missing timeline is one clear error rather than a run of 404s.
        conn.last_record_lsn(&timeline_path(tenant, *timeline))
            .await?;
    }
    while timelines.len() < args.run.clients {
        timelines.push(conn.create_timeline(tenant).await?.0);
    }
    let works = timelines
        .iter()
        .map(|&timeline| {
            let path = timeline_path(tenant, timeline);
            Work::Ingest(Box::new(IngestClient {
                ingest_path: format!("{path}/ingest"),
                timeline_path: path,
                keys: args.pages.keys,
                value_size: args.pages.value_size,
                batch_size: args.batch_size,
                next: None,
                next_key: 0,
            }))
        })
        .collect();
    let main = run_phase("ingest", &endpoint, works, &args.run).await?;
    let baseline = status_baseline(&endpoint, &args.run).await?;
    let mut details = Map::new();
    details.insert("batch_size".into(), json!(args.batch_size));
    details.insert("value_size".into(), json!(args.pages.value_size));
    details.insert("keys".into(), json!(args.pages.keys));
    details.insert("records".into(), json!(main.records));
    details.insert(
        "records_per_sec".into(),
        json!(round(main.per_sec(main.records), 1)),
    );
    details.insert("tenant_id".into(), json!(tenant.to_string()));
    details.insert(
        "timelines".into(),
        json!(timelines.iter().map(|t| t.to_string()).collect::<Vec<_>>()),
    );
    let report = Report {
        scenario: "ingest",
        clients: args.run.clients,
        main,
        baseline,
        details,
    };
    Ok(report.print(args.run.json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pageserver_api::ingest::decode_batch;

    #[test]
    pub(crate) fn key_i_is_block_i_of_one_relation_in_ascending_order() {
        assert_eq!(key_for(0), Key::rel_block(1663, 5, 16384, 0, 0));
        assert_eq!(key_for(12_345), Key::rel_block(1663, 5, 16384, 0, 12_345));
        for i in [0, 1, 255, 256, 65_535, 9_999] {
            assert_eq!(key_for(i).next(), key_for(i + 1), "keys are dense at {i}");
        }
        // The text form a GetPage query carries.
        assert_eq!(
            key_for(1).to_string(),
            concat!("00", "0000067f", "00000005", "00004000", "00", "00000001")
        );
    }

    #[test]
    pub(crate) fn pages_carry_their_stamp_and_are_checked() {
        let page = page_image(42, 8192);
        assert_eq!(page.len(), 8192);
        assert_eq!(&page[..8], &42u64.to_be_bytes());
        check_page(42, 8192, StatusCode::OK, &page).expect("its own page");
        assert_ne!(page_image(42, 8192), page_image(43, 8192));

        let wrong = check_page(43, 8192, StatusCode::OK, &page).unwrap_err();
        assert!(wrong.to_string().contains("wrong page"), "{wrong}");
        let short = check_page(42, 8192, StatusCode::OK, &page[..100]).unwrap_err();
        assert!(short.to_string().contains("100 bytes"), "{short}");
        let missing = check_page(
            42,
            8192,
            StatusCode::NOT_FOUND,
            br#"{"msg": "no such page"}"#,
        )
        .unwrap_err();
        assert!(missing.to_string().contains("404"), "{missing}");
        assert!(missing.to_string().contains("no such page"), "{missing}");

        // Pages shorter than the stamp keep what fits of it.
        let tiny = page_image(0x0102_0304, 4);
        assert_eq!(&tiny[..], &[0, 0, 0, 0]);
        check_page(0x0102_0304, 4, StatusCode::OK, &tiny).expect("tiny page");
        check_page(7, 0, StatusCode::OK, &[]).expect("empty page");
    }

    #[test]
    pub(crate) fn batches_decode_with_ascending_lsns_and_cycling_keys() {
        let step = lsn_step(8192);
        assert_eq!(step, 8224, "31-byte header + 8192 rounded up to 8");
        let first = Lsn(0x1000);
        let batch = build_batch(first, 8, 5, 10, 8192).expect("batch");
        assert_eq!(batch.records, 5);
        assert_eq!(batch.payload_bytes, 5 * 8192);
        assert_eq!(batch.last_lsn, Lsn(first.0 + 4 * step));
        assert_eq!(batch.next_key, 3, "8, 9, 0, 1, 2 then 3");

        let records = decode_batch(batch.body, 1 << 20).expect("decodes");
        let keys: Vec<Key> = records.iter().map(|r| r.key).collect();
        assert_eq!(keys, [8, 9, 0, 1, 2].map(key_for));
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.lsn, Lsn(first.0 + i as u64 * step));
            let index = [8, 9, 0, 1, 2][i];
            assert_eq!(record.value, Value::Image(page_image(index, 8192)));
        }
    }

    #[test]
    pub(crate) fn percentiles_of_a_known_distribution() {
        assert_eq!(Latency::of(&new_histogram()), Latency::default());

        // 1 µs .. 1000 µs, once each.
        let mut stats = PhaseStats::new("test");
        let t0 = Instant::now();
        for us in 1..=1000u64 {
            stats.record(t0, Duration::from_micros(us), Done::default());
        }
        let latency = Latency::of(&stats.histogram);
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.002;
        assert!(near(latency.p50_us, 500.0), "{latency:?}");
        assert!(near(latency.p99_us, 990.0), "{latency:?}");
        assert!(near(latency.p999_us, 999.0), "{latency:?}");
        assert!(near(latency.max_us, 1000.0), "{latency:?}");

        // Merging adds counts; the last completion is the latest of both.
        let mut other = PhaseStats::new("test");
        other.record(
            t0,
            Duration::from_secs(2),
            Done {
                bytes: 8,
                records: 1,
            },
        );
        stats.merge(other).expect("merge");
        assert_eq!(stats.requests, 1001);
        assert_eq!(stats.bytes, 8);
        assert_eq!(stats.last_done, Some(t0 + Duration::from_secs(2)));
        assert!(near(Latency::of(&stats.histogram).max_us, 2_000_000.0));
    }

    #[test]
    pub(crate) fn rates_divide_by_the_window_or_the_last_completion() {
        let start = Instant::now();
        let window = Window {
            start,
            end: start + Duration::from_secs(10),
        };
        assert_eq!(window.measured(None), Duration::from_secs(10));
        assert_eq!(
            window.measured(Some(start + Duration::from_secs(9))),
            Duration::from_secs(10)
        );
        assert_eq!(
            window.measured(Some(start + Duration::from_secs(11))),
            Duration::from_secs(11)
        );
    }

    #[test]
    pub(crate) fn endpoints_and_lsns_parse() {
        let e = Endpoint::parse("http://127.0.0.1:19990", Some("abc".into())).expect("parse");
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 19990));
        assert_eq!(e.authority, "127.0.0.1:19990");
        assert_eq!(e.authorization.as_ref().unwrap(), "Bearer abc");
        let e = Endpoint::parse("http://[::1]:9898/", None).expect("ipv6");
        assert_eq!((e.host.as_str(), e.port), ("::1", 9898));
        assert!(e.authorization.is_none());
        assert!(Endpoint::parse("https://localhost:9898", None).is_err());
        assert!(Endpoint::parse("http://localhost:9898/v1", None).is_err());

        assert_eq!("latest".parse::<ReadLsn>(), Ok(ReadLsn::Latest));
        assert_eq!(
            "1/A0".parse::<ReadLsn>(),
            Ok(ReadLsn::At(Lsn(0x1_0000_00A0)))
        );
        assert_eq!(ReadLsn::At(Lsn(0x1_0000_00A0)).to_string(), "1/A0");
        assert!("yesterday".parse::<ReadLsn>().is_err());
    }
}
