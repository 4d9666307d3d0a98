//! docs/openapi.yaml documents exactly the routes of the HTTP router (`pageserver::http::ROUTES`):
//! none missing, none extra.
//!
//! No YAML crate is a dependency, so the document's `paths:` section is read textually. It has
//! a fixed shape, and the reader refuses anything else, so that a typo fails instead of hiding
//! an operation:
//!
//! ```text
//! paths:
//!   /v1/tenant/{tenant_id}:        <- two spaces, starts with '/', ends with ':'
//!     parameters:                  <- four spaces: a method or a path-item field
//!       - ...                      <- deeper lines belong to the entry above
//!     get:
//!       ...
//! components:                      <- the next top-level key ends the section
//! ```

use std::collections::BTreeSet;
use std::path::PathBuf;

use pageserver::http::ROUTES;

/// Operation keys of an OpenAPI path item.
const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The other keys a path item may have.
const PATH_ITEM_FIELDS: &[&str] = &["summary", "description", "servers", "parameters", "$ref"];

type Operation = (String, String);

/// Every (METHOD, path) under `paths:`, or what is wrong with the document's shape.
fn documented_operations(yaml: &str) -> Result<Vec<Operation>, String> {
    let mut operations: Vec<Operation> = Vec::new();
    let mut paths_seen: BTreeSet<String> = BTreeSet::new();
    let mut in_paths = false;
    let mut paths_sections = 0;
    let mut current: Option<String> = None;
    let mut methods_of_current = 0;

    // A path without any operation is a mistake too.
    let close_path = |current: &Option<String>, methods: usize| match current {
        Some(path) if methods == 0 => Err(format!("path {path} has no operation")),
        _ => Ok(()),
    };

    for (index, raw) in yaml.lines().enumerate() {
        let line_no = index + 1;
        let at = |msg: &str| format!("docs/openapi.yaml line {line_no}: {msg}: {raw:?}");
        if raw.contains('\t') {
            return Err(at("a tab (YAML indentation is spaces)"));
        }
        let line = raw.trim_end();
        let content = line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = line.len() - content.len();
        if indent == 0 {
            if in_paths {
                close_path(&current, methods_of_current)?;
                current = None;
            }
            in_paths = content == "paths:";
            if in_paths {
                paths_sections += 1;
            }
            continue;
        }
        if !in_paths || indent > 4 {
            continue;
        }
        match indent {
            2 => {
                close_path(&current, methods_of_current)?;
                let key = content
                    .strip_suffix(':')
                    .ok_or_else(|| at("a path line must end with ':'"))?;
                let key = unquote(key);
                if !key.starts_with('/') {
                    return Err(at("a path must start with '/'"));
                }
                if key.contains(char::is_whitespace) {
                    return Err(at("a path has no spaces"));
                }
                if !paths_seen.insert(key.to_owned()) {
                    return Err(at("this path is documented twice"));
                }
                current = Some(key.to_owned());
                methods_of_current = 0;
            }
            4 => {
                let Some(path) = &current else {
                    return Err(at("an entry before the first path"));
                };
                let (key, rest) = content
                    .split_once(':')
                    .ok_or_else(|| at("expected `key:`"))?;
                if METHODS.contains(&key) {
                    if !rest.trim().is_empty() {
                        return Err(at("an operation is a mapping on the following lines"));
                    }
                    let operation = (key.to_uppercase(), path.clone());
                    if operations.contains(&operation) {
                        return Err(at("this operation is documented twice"));
                    }
                    operations.push(operation);
                    methods_of_current += 1;
                } else if !PATH_ITEM_FIELDS.contains(&key) {
                    return Err(at("neither an HTTP method nor a path-item field"));
                }
            }
            _ => {
                return Err(at(
                    "under `paths:`, indentation is 2 (paths) or 4 (methods)",
                ))
            }
        }
    }
    if in_paths {
        close_path(&current, methods_of_current)?;
    }
    if paths_sections != 1 {
        return Err(format!(
            "expected exactly one top-level `paths:`, found {paths_sections}"
        ));
    }
    Ok(operations)
}

fn unquote(key: &str) -> &str {
    for quote in ['\'', '"'] {
        if let Some(inner) = key.strip_prefix(quote).and_then(|k| k.strip_suffix(quote)) {
            return inner;
        }
    }
    key
}

/// Compares the routes with the documented operations; the error lists every difference.
fn compare(routes: &[(&str, &str)], documented: &[Operation]) -> Result<(), String> {
    let expected: BTreeSet<Operation> = routes
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    if expected.len() != routes.len() {
        return Err("ROUTES lists an operation twice".to_owned());
    }
    let found: BTreeSet<Operation> = documented.iter().cloned().collect();
    let missing: Vec<_> = expected.difference(&found).collect();
    let extra: Vec<_> = found.difference(&expected).collect();
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!(
            "routes missing from docs/openapi.yaml: {missing:?}"
        ));
    }
    if !extra.is_empty() {
        problems.push(format!(
            "operations in docs/openapi.yaml that the router lacks: {extra:?}"
        ));
    }
    if documented.len() != routes.len() {
        problems.push(format!(
            "docs/openapi.yaml has {} operations, the router {}",
            documented.len(),
            routes.len()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

fn openapi_yaml() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_route_is_documented() {
    let yaml = openapi_yaml();
    assert!(
        yaml.lines().next() == Some("openapi: 3.0.3"),
        "docs/openapi.yaml must start with `openapi: 3.0.3`"
    );
    let documented = documented_operations(&yaml).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(documented.len(), ROUTES.len(), "{documented:?}");
    compare(ROUTES, &documented).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn auth_is_optional_and_only_status_is_public() {
    // The security requirement is global: no credentials (auth off, the default) or a bearer
    // token (auth on). The one exception, never needing a token, is GET /v1/status.
    let yaml = openapi_yaml();
    assert!(yaml.contains("\nsecurity:\n  - {}\n  - bearerAuth: []\n"));
    assert_eq!(yaml.matches("      security: []\n").count(), 1);
    let status = yaml
        .find("  /v1/status:\n    get:\n")
        .expect("GET /v1/status");
    let public = yaml.find("      security: []\n").unwrap();
    let next_path = yaml[status + 1..].find("\n  /").unwrap() + status + 1;
    assert!(status < public && public < next_path);
}

const SAMPLE: &str = "openapi: 3.0.3
info:
  title: x
paths:
  /a:
    get:
      responses: {}
  /a/{id}:
    parameters:
      - name: id
    put:
      responses: {}
    delete:
      responses: {}
components:
  schemas: {}
";

const SAMPLE_ROUTES: &[(&str, &str)] = &[("GET", "/a"), ("PUT", "/a/{id}"), ("DELETE", "/a/{id}")];

#[test]
fn the_reader_finds_every_operation() {
    let ops = documented_operations(SAMPLE).unwrap();
    assert_eq!(ops.len(), 3);
    compare(SAMPLE_ROUTES, &ops).unwrap();
}

#[test]
fn a_route_without_docs_fails() {
    let ops = documented_operations(SAMPLE).unwrap();
    let mut routes = SAMPLE_ROUTES.to_vec();
    routes.push(("POST", "/a"));
    let err = compare(&routes, &ops).unwrap_err();
    assert!(err.contains("missing") && err.contains("\"/a\""), "{err}");
    // The same for the real routes: one more than documented is caught.
    let real = documented_operations(&openapi_yaml()).unwrap();
    let mut routes = ROUTES.to_vec();
    routes.push(("POST", "/v1/page_cache"));
    assert!(compare(&routes, &real).unwrap_err().contains("missing"));
}

#[test]
fn docs_without_a_route_fail() {
    let ops = documented_operations(SAMPLE).unwrap();
    let err = compare(&SAMPLE_ROUTES[..2], &ops).unwrap_err();
    assert!(err.contains("lacks"), "{err}");
}

#[test]
fn typos_fail() {
    let cases = [
        (
            "    get:\n      responses: {}\n  /a/{id}:",
            "    gte:\n      responses: {}\n  /a/{id}:",
        ),
        ("  /a:\n", "  a:\n"),
        ("  /a:\n", "  /a\n"),
        ("    put:\n", "   put:\n"),
        ("    put:\n", "    put: {}\n"),
        ("  /a/{id}:\n", "  /a:\n"),
        ("    delete:\n      responses: {}\n", ""),
        ("paths:\n", "path:\n"),
        (
            "    put:\n      responses: {}\n    delete:\n      responses: {}\n",
            "",
        ),
    ];
    for (from, to) in cases {
        assert!(SAMPLE.contains(from), "{from:?}");
        let broken = SAMPLE.replacen(from, to, 1);
        let outcome = documented_operations(&broken)
            .and_then(|ops| compare(SAMPLE_ROUTES, &ops).map(|()| ops));
        assert!(outcome.is_err(), "{from:?} -> {to:?} went unnoticed");
    }
}
