//! Tidy checks on the source tree (as rust-analyzer's `tidy.rs`): no import cycle between any two
//! modules of any workspace crate, and no import of the root crate's `src/` against the layer
//! order `docs/ARCHITECTURE.md` declares. Imports are read from the text: every `use crate::…`
//! statement (grouped trees expanded) and every `crate::…` path in code, test modules included;
//! comments and string literals are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace crates whose modules must not import each other in a cycle.
const CRATES: [&str; 6] = [
    "src",
    "trainer/src",
    "bandit/src",
    "clustering-kernels/src",
    "objectives/src",
    "telemetry/src",
];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_import_cycle_between_modules() {
    let mut problems = Vec::new();
    for dir in CRATES {
        let graph = ImportGraph::of_dir(&workspace().join(dir));
        for cycle in graph.cycles() {
            problems.push(format!("{dir}: {}", graph.describe_cycle(&cycle)));
        }
    }
    assert!(
        problems.is_empty(),
        "import cycles:\n{}",
        problems.join("\n")
    );
}

#[test]
fn src_imports_follow_the_declared_layers() {
    let architecture = std::fs::read_to_string(workspace().join("docs/ARCHITECTURE.md")).unwrap();
    let layers = Layers::parse(&architecture).unwrap();
    let graph = ImportGraph::of_dir(&workspace().join("src"));
    let rooms: BTreeSet<&str> = graph.modules.keys().filter_map(|m| room(m)).collect();
    let undeclared: Vec<_> = rooms.iter().filter(|r| layers.of(r).is_none()).collect();
    assert!(
        undeclared.is_empty(),
        "rooms of src/ missing from docs/ARCHITECTURE.md's layer list: {undeclared:?}"
    );
    let violations = layers.violations(&graph);
    assert!(
        violations.is_empty(),
        "imports against docs/ARCHITECTURE.md's layer order:\n{}",
        violations.join("\n")
    );
}

/// The top-level module (room) a module lives in; `None` for the crate root.
fn room(module: &str) -> Option<&str> {
    module.split("::").next().filter(|r| !r.is_empty())
}

/// Modules of one crate and the modules each imports, with where.
#[derive(Debug, Default)]
struct ImportGraph {
    /// Module path (`recommend::ope`; `""` for the crate root) → its file.
    modules: BTreeMap<String, PathBuf>,
    /// Importer → imported → the importer's line of the first such import.
    edges: BTreeMap<String, BTreeMap<String, usize>>,
}

impl ImportGraph {
    fn of_dir(src: &Path) -> Self {
        let mut files = Vec::new();
        collect_rs_files(src, &mut files);
        let sources: Vec<(String, PathBuf, String)> = files
            .into_iter()
            .filter(|file| file.file_name().is_some_and(|n| n != "main.rs"))
            .map(|file| {
                let text = std::fs::read_to_string(&file).unwrap();
                (module_path(src, &file), file, text)
            })
            .collect();
        Self::of_sources(sources)
    }

    fn of_sources(sources: Vec<(String, PathBuf, String)>) -> Self {
        let mut graph = ImportGraph {
            modules: sources
                .iter()
                .map(|(module, file, _)| (module.clone(), file.clone()))
                .collect(),
            ..ImportGraph::default()
        };
        for (module, _, text) in &sources {
            for (path, line) in crate_paths(&code_only(text)) {
                let Some(target) = graph.resolve(&path) else {
                    continue;
                };
                // A module may name its ancestors' items (re-exports); only imports of other
                // modules, or of its own descendants, are arrows.
                let ancestor = target.is_empty() || module.starts_with(&format!("{target}::"));
                if target != *module && !ancestor {
                    let targets = graph.edges.entry(module.clone()).or_default();
                    targets.entry(target).or_insert(line);
                }
            }
        }
        graph
    }

    /// The longest prefix of `path` that is a module of the crate.
    fn resolve(&self, path: &[String]) -> Option<String> {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].join("::"))
            .find(|candidate| self.modules.contains_key(candidate))
    }

    /// Every strongly connected set of two or more modules (Tarjan), each sorted.
    fn cycles(&self) -> Vec<Vec<String>> {
        let mut tarjan = Tarjan {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            next: 0,
            components: Vec::new(),
        };
        for module in self.modules.keys() {
            if !tarjan.index.contains_key(module.as_str()) {
                tarjan.visit(module);
            }
        }
        tarjan.components
    }

    /// A cycle's arrows, each with the file and line that makes it.
    fn describe_cycle(&self, cycle: &[String]) -> String {
        let members: BTreeSet<&String> = cycle.iter().collect();
        let mut arrows = Vec::new();
        for from in cycle {
            for (to, line) in self.edges.get(from).into_iter().flatten() {
                if members.contains(to) {
                    let file = self.modules[from].display();
                    arrows.push(format!("{from} -> {to} ({file}:{line})"));
                }
            }
        }
        arrows.join("; ")
    }
}

#[derive(Debug)]
struct Tarjan<'a> {
    graph: &'a ImportGraph,
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    on_stack: BTreeSet<&'a str>,
    next: usize,
    components: Vec<Vec<String>>,
}

impl<'a> Tarjan<'a> {
    fn visit(&mut self, module: &'a str) {
        self.index.insert(module, self.next);
        self.low.insert(module, self.next);
        self.next += 1;
        self.stack.push(module);
        self.on_stack.insert(module);
        for target in self
            .graph
            .edges
            .get(module)
            .into_iter()
            .flat_map(|t| t.keys())
        {
            let target = target.as_str();
            if !self.index.contains_key(target) {
                self.visit(target);
                let low = self.low[module].min(self.low[target]);
                self.low.insert(module, low);
            } else if self.on_stack.contains(target) {
                let low = self.low[module].min(self.index[target]);
                self.low.insert(module, low);
            }
        }
        if self.low[module] == self.index[module] {
            let mut component = Vec::new();
            while let Some(member) = self.stack.pop() {
                self.on_stack.remove(member);
                component.push(member.to_owned());
                if member == module {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                self.components.push(component);
            }
        }
    }
}

/// The root crate's rooms by layer, as `docs/ARCHITECTURE.md` lists them between
/// `<!-- layers: begin -->` and `<!-- layers: end -->`, lowest first, one numbered line per layer
/// naming its rooms in backticks.
#[derive(Debug)]
struct Layers {
    layer_of: BTreeMap<String, usize>,
}

impl Layers {
    fn parse(markdown: &str) -> Result<Self, String> {
        let begin = markdown
            .find("<!-- layers: begin -->")
            .ok_or("no `<!-- layers: begin -->` marker")?;
        let end = markdown[begin..]
            .find("<!-- layers: end -->")
            .ok_or("no `<!-- layers: end -->` marker")?;
        let mut layer_of = BTreeMap::new();
        let lines = markdown[begin..begin + end].lines().skip(1);
        for (layer, line) in lines.filter(|l| !l.trim().is_empty()).enumerate() {
            for room in line.split('`').skip(1).step_by(2) {
                if layer_of.insert(room.to_owned(), layer).is_some() {
                    return Err(format!("room `{room}` is listed twice"));
                }
            }
        }
        Ok(Layers { layer_of })
    }

    fn of(&self, room: &str) -> Option<usize> {
        self.layer_of.get(room).copied()
    }

    /// Imports from a room into a room of its own layer or a higher one.
    fn violations(&self, graph: &ImportGraph) -> Vec<String> {
        let mut out = Vec::new();
        for (from, targets) in &graph.edges {
            for (to, line) in targets {
                let (Some(from_room), Some(to_room)) = (room(from), room(to)) else {
                    continue;
                };
                let (Some(from_layer), Some(to_layer)) = (self.of(from_room), self.of(to_room))
                else {
                    continue;
                };
                if from_room != to_room && to_layer >= from_layer {
                    let file = graph.modules[from].display();
                    out.push(format!(
                        "{from} (layer {}) imports {to} (layer {}) at {file}:{line}",
                        from_layer + 1,
                        to_layer + 1
                    ));
                }
            }
        }
        out
    }
}

fn collect_rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/recommend/ope.rs` → `recommend::ope`; `mod.rs` and `lib.rs` name their directory.
fn module_path(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut segments: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if segments
        .last()
        .is_some_and(|last| last == "mod" || last == "lib")
    {
        segments.pop();
    }
    segments.join("::")
}

/// The text with comments and the insides of string and char literals blanked (newlines kept, so
/// line numbers hold).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        if rest.starts_with(&['/', '/']) {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i..].starts_with(&['/', '*']) {
                    depth += 1;
                    i += 2;
                    out.push_str("  ");
                } else if chars[i..].starts_with(&['*', '/']) {
                    depth -= 1;
                    i += 2;
                    out.push_str("  ");
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if rest[0] == 'r' && raw_string_hashes(rest).is_some() {
            let hashes = raw_string_hashes(rest).unwrap_or(0);
            i += 2 + hashes;
            out.push('"');
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                out.push(blank(chars[i]));
                i += 1;
            }
            i += closing.len();
            out.push('"');
        } else if rest[0] == '"' {
            i += 1;
            out.push('"');
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            i += 1;
            out.push('"');
        } else if rest[0] == '\'' && char_literal_len(rest).is_some() {
            let len = char_literal_len(rest).unwrap_or(1);
            out.push_str(&" ".repeat(len));
            i += len;
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    out
}

/// For `r"…"` or `r#"…"#` at the start (and not inside an identifier such as `for"`), how many
/// `#`s open it.
fn raw_string_hashes(rest: &[char]) -> Option<usize> {
    let hashes = rest[1..].iter().take_while(|&&c| c == '#').count();
    (rest.get(1 + hashes) == Some(&'"')).then_some(hashes)
}

/// The length of a char literal (`'a'`, `'\n'`, `'\u{1F600}'`) at the start; `None` for a
/// lifetime or label.
fn char_literal_len(rest: &[char]) -> Option<usize> {
    if rest.get(1) == Some(&'\\') {
        let close = rest[2..].iter().position(|&c| c == '\'')?;
        Some(close + 3)
    } else {
        (rest.get(2) == Some(&'\'')).then_some(3)
    }
}

/// Every path a `use crate::…` statement or an in-code `crate::…` path names, split at `::`
/// (without `crate`), with its 1-based line.
fn crate_paths(code: &str) -> Vec<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mut search = 0;
    while let Some(found) = code[search..].find("crate::") {
        let start = search + found;
        search = start + "crate::".len();
        let preceded_by_ident = code[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        if preceded_by_ident {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        let tree_end = use_tree_end(&code[search..]);
        for path in expand_use_tree(&code[search..search + tree_end]) {
            out.push((path, line));
        }
        search += tree_end;
    }
    out
}

/// Where the use tree or path after `crate::` ends: at the first character outside braces that
/// is not part of a path.
fn use_tree_end(text: &str) -> usize {
    let mut depth = 0usize;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => depth -= 1,
            _ if depth > 0 => {}
            c if c.is_alphanumeric() || c == '_' || c == ':' => {}
            _ => return at,
        }
    }
    text.len()
}

/// `a::{b, c::{d, e as f}}` → `[a, b]`, `[a, c, d]`, `[a, c, e]`; a plain path → itself.
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or_default();
        let segments: Vec<String> = path
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "*" && *s != "self")
            .map(str::to_owned)
            .collect();
        return vec![segments];
    };
    let prefix = tree[..open].trim_end_matches("::").trim();
    let prefix: Vec<String> = prefix
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let inner = tree[open + 1..]
        .strip_suffix('}')
        .unwrap_or(&tree[open + 1..]);
    let mut out = Vec::new();
    for part in split_top_level(inner) {
        for tail in expand_use_tree(part) {
            out.push(prefix.iter().cloned().chain(tail).collect());
        }
    }
    if out.is_empty() {
        out.push(prefix);
    }
    out
}

/// Splits at commas outside braces.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The checker itself, on hand-made sources: it must see what it claims to.
mod checker {
    use super::*;

    fn graph(sources: &[(&str, &str)]) -> ImportGraph {
        ImportGraph::of_sources(
            sources
                .iter()
                .map(|(module, text)| {
                    let file = PathBuf::from(format!("{}.rs", module.replace("::", "/")));
                    ((*module).to_owned(), file, (*text).to_owned())
                })
                .collect(),
        )
    }

    #[test]
    fn finds_a_cycle_through_grouped_and_inline_imports() {
        let graph = graph(&[
            ("", "pub mod a; pub mod b; pub mod c;"),
            ("a", "use crate::{b::{Thing, other as o}, c};\n"),
            ("b", "fn f() {}\n"),
            ("c", "fn g() { let x = crate::a::h(); }\n"),
        ]);
        assert_eq!(graph.cycles(), vec![vec!["a".to_owned(), "c".to_owned()]]);
        let description = graph.describe_cycle(&graph.cycles()[0]);
        assert!(description.contains("a -> c (a.rs:1)"), "{description}");
        assert!(description.contains("c -> a (c.rs:1)"), "{description}");
    }

    #[test]
    fn test_modules_count_and_comments_and_strings_do_not() {
        let cyclic = graph(&[
            ("x", "use crate::y::Y;\n"),
            ("y", "#[cfg(test)]\nmod tests {\n    use crate::x::X;\n}\n"),
        ]);
        assert_eq!(cyclic.cycles().len(), 1);
        let clean = graph(&[
            ("x", "use crate::y::Y;\n"),
            (
                "y",
                "// use crate::x::X;\n/* crate::x::X */\nconst S: &str = \"crate::x::X\";\nconst R: &str = r#\"crate::x\"#;\nconst C: char = '\"';\nfn f<'a>(_: &'a str) {}\n",
            ),
        ]);
        assert!(clean.cycles().is_empty(), "{:?}", clean.edges);
    }

    #[test]
    fn names_of_ancestors_and_other_crates_are_not_arrows() {
        let graph = graph(&[
            ("", "pub mod r;"),
            ("r", "pub mod s; pub use s::S;"),
            (
                "r::s",
                "use crate::r::Re; use other_crate::x; fn f() { foo_crate::y(); }\n",
            ),
        ]);
        assert!(graph.edges.is_empty(), "{:?}", graph.edges);
    }

    #[test]
    fn layers_refuse_upward_and_same_layer_imports() {
        let layers = Layers::parse(
            "text\n<!-- layers: begin -->\n1. `low`\n2. `mid`, `side`\n3. `high`\n<!-- layers: end -->\n",
        )
        .unwrap();
        let graph = graph(&[
            ("low", "use crate::high::H;\n"),
            ("mid", "use crate::low::L; use crate::side::S;\n"),
            ("side", ""),
            ("high", "use crate::mid::M;\n"),
        ]);
        let violations = layers.violations(&graph);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].starts_with("low (layer 1) imports high (layer 3)"));
        assert!(violations[1].starts_with("mid (layer 2) imports side (layer 2)"));
        assert!(Layers::parse("no markers").is_err());
    }
}
