//! Grammar-constrained sampling: a JSON Schema compiled by `llguidance` into per-step masks of
//! the token ids a completion may continue with, over the checkpoint's own tokenizer.
//!
//! A [`Grammar`] is compiled once per (tokenizer, schema) and shared; each completion gets a
//! [`TokenMatcher`], which answers "which tokens may come next" ([`TokenMatcher::allowed`], a
//! [`TokenSet`] bitset) and advances past the token the sampler drew ([`TokenMatcher::consume`]).
//! Sampling under the mask and recomputing log-probs under the same masks (the sampler records
//! each step's set) keeps the masked policy the one that is trained. Near its token limit a
//! sample is closed by construction: [`TokenMatcher::closing_path`] finds a short way to end,
//! and the sampler allows only its tokens (`generate::allowed_sets`).
//!
//! Why these choices:
//! - The tokenizer reaches llguidance as `tokenizer.json` bytes through
//!   [`ByteTokenizer::from_json_bytes`]: `toktrie_hf_tokenizers` links its own `tokenizers`
//!   version (0.21), so a [`crate::tokenizer::Tokenizer`] (0.23) value cannot cross over.
//! - llguidance knows tokens only as byte strings; a tokenizer whose decoder is neither byte-level
//!   nor byte-fallback has no such mapping, and [`Grammar::from_json_schema`] says so
//!   ([`GrammarError::UnsupportedTokenizer`]) instead of constraining the wrong bytes.
//! - The stop ids are the grammar's end-of-sequence tokens: llguidance allows them exactly where
//!   the grammar accepts, and once the grammar is complete (a JSON object's closing brace) they
//!   are the only tokens allowed.
//! - Rows of the embedding beyond the tokenizer's vocabulary (padding to a multiple of 64 or 128)
//!   are placeholders that can never be allowed, so `vocab_size` may exceed the tokenizer's.
//! - Where the grammar forces bytes (`{"type":"` at the start of a recommendation), llguidance
//!   allows only the first token of the tokenizer's own tokenization of them, so forced text is
//!   tokenized as the warm-up targets were.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv, TokenId};
use llguidance::{Matcher, ParserFactory};
use toktrie_hf_tokenizers::ByteTokenizer;

/// Positions [`TokenMatcher::closing_path`] visits at most (each computes one mask).
pub const CLOSING_SEARCH_NODES: usize = 400;
/// Tokens it tries at each position at most.
pub const CLOSING_SEARCH_BRANCHES: usize = 4;

/// Why a grammar could not be compiled or a completion cannot continue under it.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// `tokenizer.json` is not a tokenizer the `tokenizers` library reads.
    #[error("tokenizer.json cannot be read: {0}")]
    Tokenizer(String),
    /// The tokenizer's tokens have no byte strings llguidance could constrain.
    #[error(
        "the tokenizer cannot express a grammar (llguidance needs a byte-level or byte-fallback \
         tokenizer): {0}"
    )]
    UnsupportedTokenizer(String),
    /// `vocab_size` is smaller than the tokenizer's vocabulary.
    #[error(
        "vocab_size {vocab_size} is smaller than the tokenizer's vocabulary of {tokenizer} tokens"
    )]
    VocabSize { vocab_size: usize, tokenizer: usize },
    /// No stop ids: a completion could never end.
    #[error("no stop ids: a constrained completion needs a token that ends it")]
    NoStopIds,
    /// A stop id is not a token of the tokenizer.
    #[error("stop id {id} is not a token of the tokenizer (vocabulary of {tokenizer})")]
    StopId { id: i64, tokenizer: usize },
    /// The JSON Schema is malformed or uses what llguidance does not support.
    #[error("invalid JSON schema: {0}")]
    Schema(String),
    /// The grammar does not allow `token` at this point of the completion.
    #[error("token {token} ({text}) is not allowed by the grammar here")]
    Refused { token: i64, text: String },
    /// Nothing can follow the text so far, not even a stop token.
    #[error("the grammar allows no token here (dead end): {0}")]
    DeadEnd(String),
    /// A stop token was consumed already; the completion is over.
    #[error("the completion already ended with a stop token")]
    Finished,
    /// llguidance failed inside the matcher (its message).
    #[error("grammar matcher failed: {0}")]
    Matcher(String),
}

/// What every matcher of one grammar shares.
struct GrammarInner {
    /// The compiled grammar at the start of a completion; [`Grammar::matcher`] deep-clones it, so
    /// the schema is compiled once, not per completion.
    proto: Matcher,
    /// The tokenizer's parser factory (its token trie and lexer tables): another schema over the
    /// same tokenizer compiles from it without rebuilding them ([`Grammar::recompile`]).
    factory: Arc<ParserFactory>,
    tok_env: TokEnv,
    vocab_size: usize,
    tokenizer_vocab: usize,
    /// Sorted, no duplicates.
    stop_ids: Vec<TokenId>,
}

/// A JSON Schema compiled against one tokenizer. Cloning shares the compiled grammar.
#[derive(Clone)]
pub struct Grammar {
    inner: Arc<GrammarInner>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("vocab_size", &self.inner.vocab_size)
            .field("tokenizer_vocab", &self.inner.tokenizer_vocab)
            .field("stop_ids", &self.inner.stop_ids)
            .finish_non_exhaustive()
    }
}

/// A panic inside a dependency, as text (llguidance and toktrie assert on some malformed input).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic without a message".to_owned()
    }
}

/// `schema` compiled by `factory` into a matcher at the start of a completion; a schema
/// llguidance refuses (or panics on) is [`GrammarError::Schema`].
fn compile(factory: &ParserFactory, schema: &serde_json::Value) -> Result<Matcher, GrammarError> {
    let compiled = catch_unwind(AssertUnwindSafe(|| -> Result<Matcher, GrammarError> {
        let parser = factory
            .create_parser(TopLevelGrammar::from_json_schema(schema.clone()))
            .map_err(|e| GrammarError::Schema(format!("{e:#}")))?;
        let proto = Matcher::new(Ok(parser));
        match proto.get_error() {
            Some(message) => Err(GrammarError::Schema(message)),
            None => Ok(proto),
        }
    }));
    match compiled {
        Ok(result) => result,
        Err(payload) => Err(GrammarError::Schema(format!(
            "llguidance panicked compiling it: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

impl Grammar {
    /// Compiles `schema` over the tokenizer in `tokenizer_json` (the bytes of a checkpoint's
    /// `tokenizer.json`). `stop_ids` end a completion and are allowed exactly where the grammar
    /// accepts; `vocab_size` is the model's embedding rows (at least the tokenizer's vocabulary;
    /// the ids past it are never allowed).
    ///
    /// llguidance's JSON options come from the schema's `"x-guidance"` object (for instance
    /// `{"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}` for compact
    /// JSON; without it any JSON whitespace is allowed between tokens). Object properties are
    /// written in the schema's order.
    pub fn from_json_schema(
        tokenizer_json: &[u8],
        schema: &serde_json::Value,
        stop_ids: &[i64],
        vocab_size: usize,
    ) -> Result<Self, GrammarError> {
        let mut tokenizer = byte_tokenizer(tokenizer_json)?;
        let tokenizer_vocab = tokenizer.tokrx_info().vocab_size as usize;
        if vocab_size < tokenizer_vocab {
            return Err(GrammarError::VocabSize {
                vocab_size,
                tokenizer: tokenizer_vocab,
            });
        }
        if stop_ids.is_empty() {
            return Err(GrammarError::NoStopIds);
        }
        let mut stops = Vec::with_capacity(stop_ids.len());
        for &id in stop_ids {
            match TokenId::try_from(id) {
                Ok(t) if (t as usize) < tokenizer_vocab => stops.push(t),
                _ => {
                    return Err(GrammarError::StopId {
                        id,
                        tokenizer: tokenizer_vocab,
                    });
                }
            }
        }
        stops.sort_unstable();
        stops.dedup();
        // Checked above: non-empty and inside the tokenizer's vocabulary (it asserts both).
        tokenizer.set_eos_tokens(&stops);
        let tok_env = tokenizer
            .into_tok_env(Some(vocab_size))
            .map_err(|e| GrammarError::UnsupportedTokenizer(format!("{e:#}")))?;
        let factory = catch_unwind(AssertUnwindSafe(|| {
            ParserFactory::new_simple(&tok_env).map(|mut factory| {
                // llguidance logs to stderr by default; a bad schema is reported as our error.
                factory.quiet();
                factory
            })
        }));
        let factory = match factory {
            Ok(Ok(factory)) => Arc::new(factory),
            Ok(Err(e)) => return Err(GrammarError::UnsupportedTokenizer(format!("{e:#}"))),
            Err(payload) => {
                return Err(GrammarError::UnsupportedTokenizer(format!(
                    "llguidance panicked reading it: {}",
                    panic_message(payload.as_ref())
                )));
            }
        };
        let proto = compile(&factory, schema)?;
        Ok(Self {
            inner: Arc::new(GrammarInner {
                proto,
                factory,
                tok_env,
                vocab_size,
                tokenizer_vocab,
                stop_ids: stops,
            }),
        })
    }

    /// `schema` compiled over this grammar's tokenizer, stop ids and vocabulary: a per-prompt
    /// variant of one grammar (the recommendation schema narrowed to a prompt's configuration)
    /// without rebuilding the tokenizer's tables.
    pub fn recompile(&self, schema: &serde_json::Value) -> Result<Self, GrammarError> {
        let inner = &self.inner;
        Ok(Self {
            inner: Arc::new(GrammarInner {
                proto: compile(&inner.factory, schema)?,
                factory: Arc::clone(&inner.factory),
                tok_env: inner.tok_env.clone(),
                vocab_size: inner.vocab_size,
                tokenizer_vocab: inner.tokenizer_vocab,
                stop_ids: inner.stop_ids.clone(),
            }),
        })
    }

    /// Compiles `schema` over `tokenizer`, ending at its stop ids (`SpecialTokens::stop_ids`), for
    /// a model of `vocab_size` embedding rows.
    pub fn over_tokenizer(
        tokenizer: &crate::tokenizer::Tokenizer,
        schema: &serde_json::Value,
        vocab_size: usize,
    ) -> Result<Self, GrammarError> {
        let json = tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        let stop_ids: Vec<i64> = tokenizer
            .special_tokens()
            .stop_ids
            .iter()
            .map(|&id| i64::from(id))
            .collect();
        Self::from_json_schema(json.as_bytes(), schema, &stop_ids, vocab_size)
    }

    /// A fresh matcher at the start of a completion.
    pub fn matcher(&self) -> Result<TokenMatcher, GrammarError> {
        let matcher = self.inner.proto.deep_clone();
        if let Some(message) = matcher.get_error() {
            return Err(GrammarError::Matcher(message));
        }
        Ok(TokenMatcher {
            grammar: Arc::clone(&self.inner),
            matcher,
            ended_by_stop: false,
            mask: None,
        })
    }

    /// The model's embedding rows: the length of every [`TokenSet`] of this grammar.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// The tokenizer's vocabulary (ids at or past it are never allowed).
    pub fn tokenizer_vocab_size(&self) -> usize {
        self.inner.tokenizer_vocab
    }

    /// The ids that end a completion, sorted.
    pub fn stop_ids(&self) -> &[u32] {
        &self.inner.stop_ids
    }
}

/// Reads `tokenizer.json` into llguidance's byte view of its tokens; a parse failure and a
/// tokenizer without byte strings get different errors, and a panic of the reader becomes the
/// latter (it asserts on byte-fallback tokens it cannot parse).
fn byte_tokenizer(tokenizer_json: &[u8]) -> Result<ByteTokenizer, GrammarError> {
    // Parse with serde first, so "not a tokenizer at all" is told apart from "a tokenizer
    // toktrie cannot map to bytes" without matching on the library's message.
    if let Err(e) = serde_json::from_slice::<serde_json::Value>(tokenizer_json) {
        return Err(GrammarError::Tokenizer(format!("not JSON: {e}")));
    }
    match catch_unwind(|| ByteTokenizer::from_json_bytes(tokenizer_json)) {
        Ok(Ok(tokenizer)) => Ok(tokenizer),
        Ok(Err(e)) => {
            let message = format!("{e:#}");
            if message.starts_with("error loading tokenizer") {
                Err(GrammarError::Tokenizer(message))
            } else {
                Err(GrammarError::UnsupportedTokenizer(message))
            }
        }
        Err(payload) => Err(GrammarError::UnsupportedTokenizer(panic_message(
            payload.as_ref(),
        ))),
    }
}

/// One completion's position in the grammar.
pub struct TokenMatcher {
    grammar: Arc<GrammarInner>,
    matcher: Matcher,
    ended_by_stop: bool,
    /// The set [`Self::allowed`] computed at this position: [`Self::consume`] checks against it
    /// instead of asking llguidance again.
    mask: Option<TokenSet>,
}

impl std::fmt::Debug for TokenMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMatcher")
            .field("ended_by_stop", &self.ended_by_stop)
            .field("stop_reason", &self.matcher.stop_reason())
            .finish_non_exhaustive()
    }
}

impl TokenMatcher {
    /// The tokens allowed next: the grammar's continuations, plus the stop ids where the grammar
    /// can end here (only the stop ids once it is complete). Errors when nothing is allowed (a
    /// dead end) or after a stop token.
    pub fn allowed(&mut self) -> Result<TokenSet, GrammarError> {
        if self.ended_by_stop {
            return Err(GrammarError::Finished);
        }
        if let Some(mask) = &self.mask {
            return Ok(mask.clone());
        }
        let set = if self.matcher.is_stopped() {
            let reason = self.matcher.stop_reason();
            if !reason.is_ok() {
                return Err(self.failure(reason));
            }
            // The grammar is complete: only a stop token may follow.
            let mut set = TokenSet::empty(self.grammar.vocab_size);
            for &id in &self.grammar.stop_ids {
                set.insert(id as usize);
            }
            set
        } else {
            match self.matcher.compute_mask() {
                Ok(vob) => TokenSet::from_vob(&vob, &self.grammar),
                Err(e) => {
                    return Err(match self.matcher.stop_reason() {
                        StopReason::NoExtensionBias => GrammarError::DeadEnd(format!("{e:#}")),
                        _ => GrammarError::Matcher(format!("{e:#}")),
                    });
                }
            }
        };
        if set.is_empty() {
            return Err(GrammarError::DeadEnd(
                "no token of the vocabulary continues the text".to_owned(),
            ));
        }
        self.mask = Some(set.clone());
        Ok(set)
    }

    /// Advances past `token`. A token the grammar does not allow here is refused with its id and
    /// text, and the matcher stays where it was (the caller may try another).
    pub fn consume(&mut self, token: i64) -> Result<(), GrammarError> {
        if self.ended_by_stop {
            return Err(GrammarError::Finished);
        }
        // Checking against the mask keeps a refused token from putting llguidance's matcher
        // into its terminal error state.
        let allowed = self.allowed()?;
        if !allowed.contains(token) {
            return Err(GrammarError::Refused {
                token,
                text: self.token_text(token),
            });
        }
        // contains() checked 0 <= token < vocab_size.
        let id = token as TokenId;
        self.mask = None;
        let is_stop = self.grammar.stop_ids.binary_search(&id).is_ok();
        if is_stop && self.matcher.is_stopped() {
            // A complete grammar takes the stop token without feeding it to llguidance.
            self.ended_by_stop = true;
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| GrammarError::Matcher(format!("{e:#}")))?;
        self.ended_by_stop = is_stop;
        Ok(())
    }

    /// The grammar has ended: a stop token was consumed, or the text is complete and nothing but
    /// a stop token can follow.
    pub fn is_finished(&self) -> bool {
        self.ended_by_stop
            || (self.matcher.is_stopped()
                && self.matcher.stop_reason().is_ok()
                && self.matcher.stop_reason() != StopReason::NotStopped)
    }

    /// A copy of this position that advances on its own.
    fn fork(&self) -> TokenMatcher {
        TokenMatcher {
            grammar: Arc::clone(&self.grammar),
            matcher: self.matcher.deep_clone(),
            ended_by_stop: self.ended_by_stop,
            mask: self.mask.clone(),
        }
    }

    /// A short way to end the completion from here: tokens the grammar allows, one after
    /// another, the last a stop id, at most `limit` of them; `None` when the search finds none
    /// within `limit` tokens and [`CLOSING_SEARCH_NODES`] positions. A depth-first search that
    /// tries, at each position, a stop id first, then tokens of only closing characters (`"`,
    /// `}`, `]`; longest first), then content (letters, digits, `_`, `.`, `-`; longest first,
    /// which completes an enum value or a number soonest), then the rest (shortest first), and
    /// at most [`CLOSING_SEARCH_BRANCHES`] of them. It does not move this matcher.
    pub fn closing_path(&self, limit: usize) -> Result<Option<Vec<i64>>, GrammarError> {
        if self.ended_by_stop || limit == 0 {
            return Ok(None);
        }
        let mut path = Vec::new();
        let mut nodes = 0;
        let found = self.fork().search_closing(limit, &mut nodes, &mut path)?;
        Ok(found.then_some(path))
    }

    fn search_closing(
        &mut self,
        limit: usize,
        nodes: &mut usize,
        path: &mut Vec<i64>,
    ) -> Result<bool, GrammarError> {
        *nodes += 1;
        if *nodes > CLOSING_SEARCH_NODES {
            return Ok(false);
        }
        let allowed = match self.allowed() {
            Ok(allowed) => allowed,
            Err(GrammarError::DeadEnd(_)) => return Ok(false),
            Err(error) => return Err(error),
        };
        if let Some(&stop) = self
            .grammar
            .stop_ids
            .iter()
            .find(|&&id| allowed.contains(i64::from(id)))
        {
            path.push(i64::from(stop));
            return Ok(true);
        }
        if limit <= 1 {
            return Ok(false);
        }
        let trie = self.grammar.tok_env.tok_trie();
        let mut ranked: Vec<(u8, isize, i64)> = allowed
            .iter()
            .filter(|&id| (id as usize) < self.grammar.tokenizer_vocab)
            .map(|id| {
                let bytes = trie.token(id as TokenId);
                let closing = !bytes.is_empty() && bytes.iter().all(|b| b"\"}]".contains(b));
                let content = !bytes.is_empty()
                    && bytes
                        .iter()
                        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(b));
                let len = bytes.len() as isize;
                match (closing, content) {
                    (true, _) => (0, -len, id),
                    (false, true) => (1, -len, id),
                    (false, false) => (2, len, id),
                }
            })
            .collect();
        ranked.sort_unstable();
        for &(_, _, token) in ranked.iter().take(CLOSING_SEARCH_BRANCHES) {
            let mut next = self.fork();
            if next.consume(token).is_err() {
                continue;
            }
            path.push(token);
            if next.search_closing(limit - 1, nodes, path)? {
                return Ok(true);
            }
            path.pop();
        }
        Ok(false)
    }

    /// A token as text for error messages (special tokens as their names, bytes lossily).
    fn token_text(&self, token: i64) -> String {
        match TokenId::try_from(token) {
            Ok(id) if (id as usize) < self.grammar.tokenizer_vocab => {
                self.grammar.tok_env.tok_trie().token_dbg(id)
            }
            _ => format!(
                "outside the vocabulary [0, {}) of the grammar",
                self.grammar.vocab_size
            ),
        }
    }

    /// The matcher's failure at a stop that is not the grammar's end.
    fn failure(&self, reason: StopReason) -> GrammarError {
        let message = self
            .matcher
            .get_error()
            .unwrap_or_else(|| format!("stopped: {reason}"));
        GrammarError::Matcher(message)
    }
}

/// A set of token ids over `[0, vocab_size)`: a bitset of u32 words, bit `i % 32` of word
/// `i / 32` (llguidance's layout, so a mask is copied, not rebuilt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSet {
    words: Vec<u32>,
    vocab_size: usize,
}

impl TokenSet {
    /// Only `id` (which must be below `vocab_size`).
    pub fn only(id: i64, vocab_size: usize) -> Self {
        let mut set = Self::empty(vocab_size);
        if let Ok(id) = usize::try_from(id)
            && id < vocab_size
        {
            set.insert(id);
        }
        set
    }

    /// No token.
    pub fn empty(vocab_size: usize) -> Self {
        Self {
            words: vec![0; vocab_size.div_ceil(32)],
            vocab_size,
        }
    }

    /// Every token of the vocabulary: the row of a sample that is already finished, whose next
    /// token is never used.
    pub fn full(vocab_size: usize) -> Self {
        let mut set = Self {
            words: vec![u32::MAX; vocab_size.div_ceil(32)],
            vocab_size,
        };
        set.clear_from(vocab_size);
        set
    }

    /// llguidance's mask, cut to the tokenizer's ids: the placeholder rows past it stay out even
    /// if a future llguidance were to allow them.
    fn from_vob(vob: &SimpleVob, grammar: &GrammarInner) -> Self {
        let mut set = Self::empty(grammar.vocab_size);
        let source = vob.as_slice();
        let n = set.words.len().min(source.len());
        set.words[..n].copy_from_slice(&source[..n]);
        set.clear_from(grammar.tokenizer_vocab);
        set
    }

    /// Clears every id at or past `start`.
    fn clear_from(&mut self, start: usize) {
        let first_word = start / 32;
        if first_word >= self.words.len() {
            return;
        }
        let bit = start % 32;
        self.words[first_word] &= (1u32 << bit).wrapping_sub(1);
        for word in &mut self.words[first_word + 1..] {
            *word = 0;
        }
    }

    /// Adds `id` (ignored outside the vocabulary).
    fn insert(&mut self, id: usize) {
        if id < self.vocab_size {
            self.words[id / 32] |= 1 << (id % 32);
        }
    }

    /// Whether `id` is allowed; ids outside `[0, vocab_size)` never are.
    pub fn contains(&self, id: i64) -> bool {
        match usize::try_from(id) {
            Ok(i) if i < self.vocab_size => self.words[i / 32] & (1 << (i % 32)) != 0,
            _ => false,
        }
    }

    /// How many ids are allowed.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether no id is allowed.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The ids the set ranges over.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The allowed ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros();
                rest &= rest - 1;
                Some((w * 32 + bit as usize) as i64)
            })
        })
    }

    /// The bitset's words (bit `i % 32` of word `i / 32`), e.g. to store a mask compactly.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Writes the set as bools into `out` (`vocab_size` long).
    fn write_bools(&self, out: &mut [bool]) {
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = self.words[i / 32] & (1 << (i % 32)) != 0;
        }
    }

    /// `[vocab_size]` bool tensor, true where allowed (on `device`).
    pub fn to_tensor(&self, device: tch::Device) -> Result<tch::Tensor, tch::TchError> {
        let mut bools = vec![false; self.vocab_size];
        self.write_bools(&mut bools);
        tch::Tensor::f_from_slice(&bools)?.f_to(device)
    }
}

/// Stacks sets into a `[sets.len(), vocab_size]` bool tensor on `device` (one host→device copy).
/// Every set must range over the same vocabulary.
pub fn stack_token_sets(
    sets: &[&TokenSet],
    device: tch::Device,
) -> Result<tch::Tensor, tch::TchError> {
    let vocab_size = sets.first().map_or(0, |s| s.vocab_size);
    if let Some(other) = sets.iter().find(|s| s.vocab_size != vocab_size) {
        return Err(tch::TchError::Shape(format!(
            "token sets over different vocabularies: {vocab_size} and {}",
            other.vocab_size
        )));
    }
    let mut bools = vec![false; sets.len() * vocab_size];
    if vocab_size > 0 {
        for (set, row) in sets.iter().zip(bools.chunks_mut(vocab_size)) {
            set.write_bools(row);
        }
    }
    let rows = i64::try_from(sets.len()).map_err(|e| tch::TchError::Convert(e.to_string()))?;
    let cols = i64::try_from(vocab_size).map_err(|e| tch::TchError::Convert(e.to_string()))?;
    tch::Tensor::f_from_slice(&bools)?
        .f_reshape([rows, cols])?
        .f_to(device)
}
