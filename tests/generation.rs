//! Generation: chat templates, streaming detokenization, the sampler, and the runner (chunked
//! prefill, KV-cache reuse, budget, cancellation, context policy) on the tiny Llama and Gemma 4
//! fixtures run by our CPU runtime. Tokenizers are built here as `tokenizer.json` text, the
//! format real models ship.

mod common;

use common::{fixtures, read_npy, rel_l2};
use pteria::llm::{
    CancelToken, ChatTemplate, Completion, ContextPolicy, DecodeOptions, Decoded, Engine, Event,
    GenerateOptions, LlmError, LoadOptions, Message, Model, ModelFiles, Prefill, RenderOptions,
    Runner, RunnerConfig, Sampler, SamplingParams, StopReason, Tokenizer,
};
use pteria::runtime::BackendRegistry;
use serde_json::json;
use std::path::{Path, PathBuf};

const LLAMA: &str = "llama_tiny_portable_fp32.pte";
const GEMMA: &str = "gemma4_tiny_portable_fp32.pte";
/// The fixtures' prompt and decode tokens (tests/fixtures/manifest.json).
const PROMPT: [u32; 10] = [2, 17, 93, 150, 8, 201, 66, 34, 250, 120];
const DECODE: [u32; 4] = [45, 7, 199, 88];

fn runner(file: &str, config: RunnerConfig) -> Runner {
    Runner::open(
        &fixtures().join(file),
        &[],
        &BackendRegistry::default(),
        &config,
    )
    .unwrap()
}

fn chunked(chunk: usize) -> RunnerConfig {
    RunnerConfig {
        prefill_chunk: Some(chunk),
        ..RunnerConfig::default()
    }
}

fn gen_prompt() -> RenderOptions {
    RenderOptions {
        add_generation_prompt: true,
        enable_thinking: false,
    }
}

// ---------------------------------------------------------------------------------------------
// Chat templates

#[test]
fn builtin_gemma4_format_renders_the_documented_prompts() {
    let t = ChatTemplate::gemma4();
    assert_eq!(
        t.render(&[Message::user("Hello")], gen_prompt()).unwrap(),
        "<bos><|turn>user\nHello<turn|>\n<|turn>model\n"
    );
    let convo = [
        Message::system("You are helpful."),
        Message::user("Hi"),
        Message::assistant("Hello!"),
        Message::user("How are you?"),
    ];
    assert_eq!(
        t.render(&convo, gen_prompt()).unwrap(),
        "<bos><|turn>system\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n\
         <|turn>user\nHow are you?<turn|>\n<|turn>model\n"
    );
    let thinking = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: true,
    };
    assert_eq!(
        t.render(&[Message::system("You are helpful."), Message::user("Hi")], thinking).unwrap(),
        "<bos><|turn>system\n<|think|>\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    );
    // Thinking without a system message still opens a system turn for the think token.
    assert_eq!(
        t.render(&[Message::user("Hi")], thinking).unwrap(),
        "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    );
    // No generation prompt; contents trimmed; earlier thoughts stripped from model turns.
    assert_eq!(
        t.render(
            &[
                Message::user("  Hi \n"),
                Message::assistant("<|channel>thought\nThey greet me.<channel|>Hello!")
            ],
            RenderOptions::default()
        )
        .unwrap(),
        "<bos><|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
    );
}

#[test]
fn a_config_without_a_template_gets_the_builtin_gemma4_format() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tokenizer_config.json");
    std::fs::write(
        &cfg,
        r#"{"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": false}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_config_file(&cfg).unwrap();
    assert!(t.is_builtin());
    assert_eq!(
        t.render(&[Message::user("Hello")], gen_prompt()).unwrap(),
        "<bos><|turn>user\nHello<turn|>\n<|turn>model\n"
    );
    // A chat_template.jinja beside the config takes precedence over the built-in format.
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ bos_token }}J").unwrap();
    let t = ChatTemplate::from_config_file(&cfg).unwrap();
    assert!(!t.is_builtin());
    assert_eq!(t.render(&[], gen_prompt()).unwrap(), "<bos>J");
}

/// Gemma 4's plain-chat rules written as a Jinja template (as `transformers` would run it):
/// minijinja with HF's settings must render it exactly as the built-in format does.
const GEMMA4_PLAIN_JINJA: &str = "{{ bos_token }}
{%- if messages[0]['role'] == 'system' or enable_thinking -%}
{{ '<|turn>system\\n' }}{% if enable_thinking %}{{ '<|think|>\\n' }}{% endif %}
{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] | trim }}{% endif %}{{ '<turn|>\\n' }}
{%- endif %}
{%- for message in messages -%}
{%- if not (loop.first and message['role'] == 'system') -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<|turn>' + role + '\\n' }}{{ message['content'] | trim }}{{ '<turn|>\\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}";

#[test]
fn jinja_rendering_agrees_with_the_builtin_gemma4_format() {
    let jinja = ChatTemplate::jinja(
        GEMMA4_PLAIN_JINJA,
        &[("bos_token", "<bos>"), ("eos_token", "<eos>")],
    );
    let builtin = ChatTemplate::gemma4();
    let convos = [
        vec![Message::user("Hello")],
        vec![
            Message::system(" Be brief. "),
            Message::user("Hi"),
            Message::assistant("Hey."),
            Message::user("Bye"),
        ],
        vec![
            Message::user("a"),
            Message::assistant("b"),
            Message::user("c"),
        ],
    ];
    for convo in &convos {
        for add_generation_prompt in [false, true] {
            for enable_thinking in [false, true] {
                let o = RenderOptions {
                    add_generation_prompt,
                    enable_thinking,
                };
                assert_eq!(
                    jinja.render(convo, o).unwrap(),
                    builtin.render(convo, o).unwrap(),
                    "{convo:?} {o:?}"
                );
            }
        }
    }
}

/// SmolLM2-Instruct's `chat_template` (tokenizer_config.json of HuggingFaceTB/SmolLM2-*-Instruct).
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn smollm2_config() -> String {
    json!({
        "add_prefix_space": false,
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "chat_template": SMOLLM2_TEMPLATE,
    })
    .to_string()
}

#[test]
fn chatml_smollm2_template_renders_like_transformers() {
    let t = ChatTemplate::from_config_json(&smollm2_config(), None).unwrap();
    assert!(!t.is_builtin());
    // Without a system message the template supplies its default one.
    assert_eq!(
        t.render(&[Message::user("Hi")], gen_prompt()).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&[Message::system("Be brief."), Message::user("Hi")], gen_prompt()).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without the generation prompt: the conversation as history, contents untouched.
    assert_eq!(
        t.render(
            &[Message::system("S"), Message::user(" Hi "), Message::assistant("Hello")],
            RenderOptions::default()
        )
        .unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
    );
}

// ---------------------------------------------------------------------------------------------
// Tokenizers built as tokenizer.json text

fn added(id: u32, content: &str) -> serde_json::Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": true})
}

/// A SentencePiece-style (Llama/Gemma) byte-fallback BPE: `<unk> <s> </s>`, the 256 byte
/// tokens, then `words`; "▁" for spaces, decoder Replace → ByteFallback → Fuse → Strip.
fn byte_fallback_tokenizer(
    words: &[&str],
    specials: &[&str],
) -> (Tokenizer, serde_json::Map<String, serde_json::Value>) {
    let all: Vec<&str> = ["<unk>", "<s>", "</s>"]
        .iter()
        .chain(specials)
        .copied()
        .collect();
    let tj = common::byte_fallback_json(&all, words, &[]);
    let vocab = tj["model"]["vocab"].as_object().unwrap().clone();
    (Tokenizer::from_json(&tj.to_string()).unwrap(), vocab)
}

fn id(vocab: &serde_json::Map<String, serde_json::Value>, token: &str) -> u32 {
    vocab[token].as_u64().unwrap() as u32
}

/// Pushes ids one by one; returns the deltas (None where the decoder held back).
fn stream(tok: &Tokenizer, ids: &[u32]) -> Vec<Option<String>> {
    let mut s = tok.stream();
    let mut out: Vec<Option<String>> = ids.iter().map(|&i| s.push(i).unwrap()).collect();
    out.push(s.finish().unwrap());
    out
}

#[test]
fn streaming_holds_back_byte_fallback_tokens_until_the_character_is_complete() {
    let (tok, v) = byte_fallback_tokenizer(&["▁caf", "▁ok", "!"], &[]);
    let b = |x: u8| id(&v, &format!("<0x{x:02X}>"));
    // "café ok😀!": é = C3 A9, 😀 = F0 9F 98 80, each byte its own token.
    let ids = [
        id(&v, "▁caf"),
        b(0xC3),
        b(0xA9),
        id(&v, "▁ok"),
        b(0xF0),
        b(0x9F),
        b(0x98),
        b(0x80),
        id(&v, "!"),
    ];
    let deltas = stream(&tok, &ids);
    let s = |x: &str| Some(x.to_string());
    assert_eq!(
        deltas,
        vec![
            s("caf"),
            None,
            s("é"),
            s(" ok"),
            None,
            None,
            None,
            s("😀"),
            s("!"),
            None
        ]
    );
    let joined: String = deltas.iter().flatten().cloned().collect();
    assert_eq!(joined, tok.decode(&ids, true).unwrap());
    assert_eq!(joined, "café ok😀!");
    // What the same tokens would give decoded one at a time: broken characters.
    let naive: String = ids
        .iter()
        .map(|&i| tok.decode(&[i], true).unwrap())
        .collect();
    assert!(naive.contains('\u{FFFD}'), "{naive}");
}

#[test]
fn streaming_flushes_an_incomplete_character_at_the_end_and_gives_up_on_invalid_bytes() {
    let (tok, v) = byte_fallback_tokenizer(&["▁a"], &[]);
    let b = |x: u8| id(&v, &format!("<0x{x:02X}>"));
    // A generation cut off after the first byte of "€" (E2 82 AC).
    assert_eq!(
        stream(&tok, &[id(&v, "▁a"), b(0xE2)]),
        vec![Some("a".into()), None, Some("\u{FFFD}".into())]
    );
    // 0xFF is never part of a character: each is shown as U+FFFD at once, and valid bytes
    // after it are not swallowed (decoding the run in one go would turn all five into U+FFFD).
    let s = |x: &str| Some(x.to_string());
    let ids = [
        b(0xFF),
        b(0xFF),
        b(0x41),
        b(0xE2),
        b(0x82),
        b(0x41),
        id(&v, "▁a"),
    ];
    assert_eq!(
        stream(&tok, &ids),
        vec![
            s("\u{FFFD}"),
            s("\u{FFFD}"),
            s("A"),
            None,
            None,
            s("\u{FFFD}A"),
            s(" a"),
            None
        ]
    );
    assert_eq!(tok.decode(&ids[..6], true).unwrap(), "\u{FFFD}".repeat(6));
}

/// GPT-2's byte ↔ printable-character map (byte-level BPE, as SmolLM2's tokenizer uses).
fn byte_level_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

#[test]
fn streaming_handles_byte_level_tokens_that_end_inside_a_character() {
    let word = |s: &[u8]| s.iter().map(|&b| byte_level_char(b)).collect::<String>();
    // "naïve café": ï = C3 AF, é = C3 A9; tokens split inside both characters.
    let pieces: Vec<String> = vec![
        word(b"na\xC3"),
        word(b"\xAFve"),
        word(b" caf"),
        word(b"\xC3"),
        word(b"\xA9"),
    ];
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|endoftext|>".into(), json!(0));
    for p in &pieces {
        let n = vocab.len();
        vocab.insert(p.clone(), json!(n));
    }
    let tj = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<|endoftext|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    let tok = Tokenizer::from_json(&tj.to_string()).unwrap();
    let deltas = stream(&tok, &[1, 2, 3, 4, 5, 0]);
    let s = |x: &str| Some(x.to_string());
    // "na" is held with the partial "ï"; the special token at the end shows nothing.
    assert_eq!(
        deltas,
        vec![None, s("naïve"), s(" caf"), None, s("é"), None, None]
    );
}

#[test]
fn end_of_turn_tokens_are_read_from_the_template() {
    let (tok, v) = byte_fallback_tokenizer(&[], &["<|im_start|>", "<|im_end|>"]);
    let chatml = ChatTemplate::from_config_json(&smollm2_config(), None).unwrap();
    assert_eq!(chatml.end_of_turn_ids(&tok), vec![id(&v, "<|im_end|>")]);
    let (tok, v) = byte_fallback_tokenizer(&[], &["<|turn>", "<turn|>"]);
    assert_eq!(
        ChatTemplate::gemma4().end_of_turn_ids(&tok),
        vec![id(&v, "<turn|>")]
    );
    // A format that ends turns with plain text has no end-of-turn token.
    let plain = ChatTemplate::jinja(
        "{% for m in messages %}{{ m['content'] }}\n\n{% endfor %}",
        &[],
    );
    assert_eq!(plain.end_of_turn_ids(&tok), Vec::<u32>::new());
}

// ---------------------------------------------------------------------------------------------
// Sampler

fn dist(params: SamplingParams, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
    Sampler::new(params)
        .unwrap()
        .distribution(logits, history)
        .unwrap()
}

fn ids_of(d: &[(u32, f64)]) -> Vec<u32> {
    d.iter().map(|x| x.0).collect()
}

fn open_sampling(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        seed: Some(42),
        ..SamplingParams::default()
    }
}

/// Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 at temperature 1 (in a shuffled order).
fn halving_logits() -> Vec<f32> {
    let p = [0.0625f32, 0.5, 0.125, 0.0625, 0.25];
    p.iter().map(|x| x.ln()).collect()
}

#[test]
fn top_k_keeps_exactly_the_k_most_likely_tokens() {
    let l = halving_logits();
    let d = dist(
        SamplingParams {
            top_k: 3,
            ..open_sampling(1.0)
        },
        &l,
        &[],
    );
    assert_eq!(ids_of(&d), vec![1, 4, 2]);
    // Renormalised over the three: 0.5/0.875, 0.25/0.875, 0.125/0.875.
    for ((_, p), want) in d.iter().zip([4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
        assert!((p - want).abs() < 1e-6, "{d:?}");
    }
    // Ties at the boundary go to the lower id: 0 and 3 are equally likely.
    let d = dist(
        SamplingParams {
            top_k: 4,
            ..open_sampling(1.0)
        },
        &l,
        &[],
    );
    assert_eq!(ids_of(&d), vec![1, 4, 2, 0]);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let l = halving_logits();
    let with = |p: f32| {
        ids_of(&dist(
            SamplingParams {
                top_p: p,
                ..open_sampling(1.0)
            },
            &l,
            &[],
        ))
    };
    assert_eq!(with(0.4), vec![1]);
    assert_eq!(with(0.7), vec![1, 4]);
    assert_eq!(with(0.8), vec![1, 4, 2]);
    assert_eq!(with(0.9), vec![1, 4, 2, 0]);
    assert_eq!(with(1.0), vec![1, 4, 2, 0, 3]);
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_most_likely() {
    let l = halving_logits();
    let with = |m: f32| {
        ids_of(&dist(
            SamplingParams {
                min_p: m,
                ..open_sampling(1.0)
            },
            &l,
            &[],
        ))
    };
    assert_eq!(with(0.3), vec![1, 4]); // threshold 0.15
    assert_eq!(with(0.2), vec![1, 4, 2]); // threshold 0.10
    assert_eq!(with(0.1), vec![1, 4, 2, 0, 3]); // threshold 0.05
                                                // Filters compose: top-k 4 then min-p 0.2.
    let d = dist(
        SamplingParams {
            top_k: 4,
            min_p: 0.2,
            ..open_sampling(1.0)
        },
        &l,
        &[],
    );
    assert_eq!(ids_of(&d), vec![1, 4, 2]);
}

#[test]
fn temperature_sampling_frequencies_match_the_softmax() {
    let logits = [2.0f32, 1.0, 0.5, -1.0, 0.0];
    let t = 0.8f64;
    let z: f64 = logits.iter().map(|&x| (x as f64 / t).exp()).sum();
    let p: Vec<f64> = logits.iter().map(|&x| (x as f64 / t).exp() / z).collect();
    let n = 40_000;
    let mut s = Sampler::new(open_sampling(0.8)).unwrap();
    let mut counts = [0usize; 5];
    for _ in 0..n {
        counts[s.sample(&logits, &[]).unwrap() as usize] += 1;
    }
    let mut chi2 = 0.0;
    for (c, q) in counts.iter().zip(&p) {
        let expect = n as f64 * q;
        let sd = (n as f64 * q * (1.0 - q)).sqrt();
        assert!((*c as f64 - expect).abs() < 5.0 * sd, "{counts:?} vs {p:?}");
        chi2 += (*c as f64 - expect).powi(2) / expect;
    }
    // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
    assert!(chi2 < 18.47, "chi2 {chi2}, counts {counts:?}");
}

#[test]
fn a_seed_reproduces_a_generation_and_another_seed_does_not() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
    let draw = |seed| {
        let mut s = Sampler::new(SamplingParams {
            seed: Some(seed),
            ..open_sampling(1.5)
        })
        .unwrap();
        (0..64)
            .map(|_| s.sample(&logits, &[]).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(7), draw(7));
    assert_ne!(draw(7), draw(8));
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
    let logits = [2.0f32, -1.0, 0.5, 1.9];
    // Token 0 appears twice in the history but is penalised once.
    let history = [0, 1, 0];
    let penalised = [2.0 / 1.5, -1.5, 0.5, 1.9];
    let p = SamplingParams {
        repetition_penalty: 1.5,
        ..open_sampling(1.0)
    };
    let d = dist(p.clone(), &logits, &history);
    let z: f64 = penalised.iter().map(|&x: &f64| x.exp()).sum();
    for (id, prob) in &d {
        let want = penalised[*id as usize].exp() / z;
        assert!((prob - want).abs() < 1e-6, "token {id}: {prob} vs {want}");
    }
    // Greedy sees the penalty too: token 0 loses to token 3.
    let mut greedy = Sampler::new(SamplingParams {
        temperature: 0.0,
        ..p.clone()
    })
    .unwrap();
    assert_eq!(greedy.sample(&logits, &history).unwrap(), 3);
    assert_eq!(greedy.sample(&logits, &[]).unwrap(), 0);
    // A window of 1 only looks at the last token (0).
    let mut windowed = Sampler::new(SamplingParams {
        repetition_window: 1,
        temperature: 0.0,
        ..p
    })
    .unwrap();
    assert_eq!(windowed.sample(&logits, &[0]).unwrap(), 3);
    assert_eq!(windowed.sample(&logits, &[3, 1]).unwrap(), 0);
}

// ---------------------------------------------------------------------------------------------
// Runner on the fixtures

#[test]
fn metadata_is_read_from_the_program() {
    let r = runner(LLAMA, RunnerConfig::default());
    let m = r.metadata();
    assert_eq!(
        (m.max_seq_len, m.max_context_len, m.max_input_len),
        (32, 32, 31)
    );
    assert!(m.use_kv_cache && m.enable_dynamic_shape);
    assert_eq!(
        (m.bos_id, m.eos_ids.clone(), m.vocab_size),
        (Some(1), vec![2], 256)
    );
    assert!(m.defaulted.is_empty(), "{:?}", m.defaulted);
    // The chunk is min(declared input bound 31, max_seq_len 32).
    assert_eq!(r.prefill_chunk(), 31);
    assert_eq!(r.context_len(), 32);
    let g = runner(GEMMA, chunked(100));
    assert_eq!(g.metadata().eos_ids, vec![1, 106]);
    assert_eq!(g.prefill_chunk(), 31);
}

fn golden(name: &str) -> Vec<Vec<f64>> {
    let (shape, vals) = read_npy(&fixtures().join(name));
    vals.chunks(shape[1]).map(<[f64]>::to_vec).collect()
}

#[test]
fn chunked_prefill_gives_the_same_logits_as_one_shot() {
    let never = CancelToken::new();
    for (file, gold) in [
        (LLAMA, "llama_tiny_fp32.golden.npy"),
        (GEMMA, "gemma4_tiny_fp32.golden.npy"),
    ] {
        let gold = golden(gold);
        let mut one_shot = runner(file, RunnerConfig::default());
        let p = one_shot.prefill(&PROMPT, &never, &mut |_, _| {}).unwrap();
        assert_eq!((p.chunks, p.prefilled, p.reused), (1, 10, 0));
        let reference = one_shot.logits().unwrap().to_vec();
        assert!(
            rel_l2(&reference, &gold[0]) < 1e-5,
            "{file}: one-shot vs golden"
        );
        for chunk in [1, 3, 4] {
            let mut r = runner(file, chunked(chunk));
            let mut progress = Vec::new();
            let p = r
                .prefill(&PROMPT, &never, &mut |done, total| {
                    progress.push((done, total))
                })
                .unwrap();
            assert_eq!(p.chunks, 10usize.div_ceil(chunk));
            assert_eq!(progress.last(), Some(&(10, 10)));
            let l = r.logits().unwrap();
            let err = rel_l2(l, &reference.iter().map(|&x| x as f64).collect::<Vec<_>>());
            assert!(err < 1e-5, "{file}, chunk {chunk}: rel L2 {err}");
            // Decode steps on the chunk-filled cache still match the goldens.
            let mut seq = PROMPT.to_vec();
            for (k, &t) in DECODE.iter().enumerate() {
                seq.push(t);
                let p = r.prefill(&seq, &never, &mut |_, _| {}).unwrap();
                assert_eq!((p.reused, p.prefilled, p.reset), (seq.len() - 1, 1, false));
                let err = rel_l2(r.logits().unwrap(), &gold[k + 1]);
                assert!(
                    err < 1e-5,
                    "{file}, chunk {chunk}, decode {k}: rel L2 {err}"
                );
            }
        }
    }
}

fn greedy() -> Sampler {
    Sampler::new(SamplingParams::greedy()).unwrap()
}

fn no_stops(max: Option<usize>) -> DecodeOptions {
    DecodeOptions {
        max_new_tokens: max,
        stop_ids: Vec::new(),
    }
}

/// A run of `prompt` drawn by `sampler`, with no stop ids and no cancellation.
fn generate_with(
    r: &mut Runner,
    sampler: &mut Sampler,
    prompt: &[u32],
    max: Option<usize>,
) -> (Prefill, Decoded) {
    r.generate(
        prompt,
        sampler,
        &no_stops(max),
        &CancelToken::new(),
        &mut |_| Ok(()),
    )
    .unwrap()
}

/// A greedy run of `prompt` with no stop ids and no cancellation.
fn greedy_generate(r: &mut Runner, prompt: &[u32], max: Option<usize>) -> (Prefill, Decoded) {
    generate_with(r, &mut greedy(), prompt, max)
}

#[test]
fn generation_budget_is_max_context_len_minus_cached_tokens() {
    let never = CancelToken::new();
    let mut r = runner(LLAMA, RunnerConfig::default());
    let (_, d) = greedy_generate(&mut r, &PROMPT, None);
    assert_eq!((d.tokens.len(), d.stop), (32 - 10, StopReason::ContextFull));
    // The last token is not fed: the cache holds the prompt and all but one generated token.
    assert_eq!(r.cached_tokens().len(), 31);

    // A second turn that extends the cache: its budget is what the cache has left.
    let mut r = runner(LLAMA, RunnerConfig::default());
    let (_, d1) = greedy_generate(&mut r, &PROMPT, Some(5));
    assert_eq!(d1.stop, StopReason::MaxTokens);
    let mut turn2 = PROMPT.to_vec();
    turn2.extend(&d1.tokens);
    turn2.extend([3, 4, 5]);
    let (p, d2) = greedy_generate(&mut r, &turn2, None);
    assert_eq!((p.reused, p.prefilled), (14, 4));
    assert_eq!(
        (d2.tokens.len(), d2.stop),
        (32 - 18, StopReason::ContextFull)
    );

    // A configured context limit lowers the budget the same way.
    let mut r = runner(
        LLAMA,
        RunnerConfig {
            context_limit: Some(16),
            ..RunnerConfig::default()
        },
    );
    let (_, d) = greedy_generate(&mut r, &PROMPT, None);
    assert_eq!((d.tokens.len(), d.stop), (6, StopReason::ContextFull));
    // Zero of either is refused at load, naming which.
    for (config, what) in [
        (
            RunnerConfig {
                context_limit: Some(0),
                ..RunnerConfig::default()
            },
            "the context limit must be at least one token",
        ),
        (chunked(0), "the prefill chunk must be at least one token"),
    ] {
        let path = fixtures().join(LLAMA);
        match Runner::open(&path, &[], &BackendRegistry::default(), &config) {
            Err(e) => assert!(e.to_string().contains(what), "{e}"),
            Ok(_) => panic!("{what}: loaded"),
        }
    }
    let too_long: Vec<u32> = (0..17).collect();
    assert!(matches!(
        r.prefill(&too_long, &never, &mut |_, _| {}),
        Err(LlmError::PromptTooLong {
            tokens: 17,
            limit: 16
        })
    ));
}

#[test]
fn stop_tokens_end_the_reply_and_are_not_part_of_it() {
    let never = CancelToken::new();
    let mut r = runner(LLAMA, RunnerConfig::default());
    let (_, free) = greedy_generate(&mut r, &PROMPT, Some(8));
    // Make the fourth greedy token a stop token: the same run ends there.
    let stop = free.tokens[3];
    let first = free.tokens.iter().position(|&t| t == stop).unwrap();
    let opts = DecodeOptions {
        max_new_tokens: Some(8),
        stop_ids: vec![stop],
    };
    let (_, d) = r
        .generate(&PROMPT, &mut greedy(), &opts, &never, &mut |_| Ok(()))
        .unwrap();
    assert_eq!(d.stop, StopReason::EndOfTurn(stop));
    assert_eq!(d.tokens, free.tokens[..first]);
}

#[test]
fn cancellation_stops_prefill_between_chunks_and_the_cache_stays_usable() {
    let cancel = CancelToken::new();
    let mut r = runner(LLAMA, chunked(4));
    let c = cancel.clone();
    let p = r
        .prefill(&PROMPT, &cancel, &mut |done, _| {
            if done >= 4 {
                c.cancel();
            }
        })
        .unwrap();
    assert!(p.cancelled);
    assert_eq!((p.chunks, p.prefilled), (1, 4));
    assert_eq!(r.cached_tokens(), &PROMPT[..4]);
    // Decoding after a cancelled prefill does nothing with a cancelled token.
    let d = r
        .decode(&mut greedy(), &no_stops(None), &cancel, &mut |_| Ok(()))
        .unwrap();
    assert_eq!((d.tokens.len(), d.stop), (0, StopReason::Cancelled));

    // Resuming with a fresh token reuses the 4 cached tokens and ends where one-shot does.
    let never = CancelToken::new();
    let p = r.prefill(&PROMPT, &never, &mut |_, _| {}).unwrap();
    assert_eq!((p.reused, p.prefilled, p.reset), (4, 6, false));
    let mut one_shot = runner(LLAMA, RunnerConfig::default());
    one_shot.prefill(&PROMPT, &never, &mut |_, _| {}).unwrap();
    let reference: Vec<f64> = one_shot
        .logits()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    assert!(rel_l2(r.logits().unwrap(), &reference) < 1e-5);
}

#[test]
fn cancellation_stops_decode_between_steps() {
    let mut r = runner(LLAMA, RunnerConfig::default());
    let (_, full) = greedy_generate(&mut r, &PROMPT, Some(10));

    let cancel = CancelToken::new();
    let mut r = runner(LLAMA, RunnerConfig::default());
    let c = cancel.clone();
    let mut seen = 0;
    let (_, d) = r
        .generate(
            &PROMPT,
            &mut greedy(),
            &no_stops(Some(10)),
            &cancel,
            &mut |_| {
                seen += 1;
                if seen == 3 {
                    c.cancel();
                }
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(d.stop, StopReason::Cancelled);
    assert_eq!(d.tokens, full.tokens[..3]);
    // No forward ran for the third token once cancelled.
    assert_eq!(r.cached_tokens().len(), 10 + 2);
}

#[test]
fn kv_reuse_generates_the_same_tokens_as_a_full_reprefill() {
    let mut r = runner(LLAMA, chunked(7));
    let (_, d1) = greedy_generate(&mut r, &PROMPT, Some(6));
    let mut turn2 = PROMPT.to_vec();
    turn2.extend(&d1.tokens);
    turn2.extend([11, 12, 13]);
    let (p, reused) = greedy_generate(&mut r, &turn2, Some(8));
    // 10 prompt tokens + 5 fed generated tokens were cached; the 6th and the new 3 are run.
    assert_eq!((p.reused, p.prefilled, p.reset), (15, 4, false));
    let logits_reused = r.logits().map(<[f32]>::to_vec);

    let mut fresh = runner(LLAMA, chunked(7));
    let (p, full) = greedy_generate(&mut fresh, &turn2, Some(8));
    assert_eq!((p.reused, p.prefilled), (0, 19));
    assert_eq!(reused.tokens, full.tokens);
    let reference: Vec<f64> = fresh.logits().unwrap().iter().map(|&x| x as f64).collect();
    assert!(rel_l2(&logits_reused.unwrap(), &reference) < 1e-5);

    // A prompt that diverges from the cache resets it and still matches a fresh run.
    let mut other = PROMPT.to_vec();
    other[5] = 99;
    let resets = r.resets();
    let (p, diverged) = greedy_generate(&mut r, &other, Some(8));
    assert_eq!((p.reused, p.prefilled, p.reset), (0, 10, true));
    assert_eq!(r.resets(), resets + 1);
    let (_, want) = greedy_generate(&mut runner(LLAMA, chunked(7)), &other, Some(8));
    assert_eq!(diverged.tokens, want.tokens);
}

#[test]
fn bad_token_ids_are_errors_not_panics() {
    let never = CancelToken::new();
    let mut r = runner(LLAMA, RunnerConfig::default());
    assert!(matches!(
        r.prefill(&[1, 256], &never, &mut |_, _| {}),
        Err(LlmError::TokenOutOfRange {
            id: 256,
            vocab: 256
        })
    ));
    assert!(matches!(
        r.prefill(&[], &never, &mut |_, _| {}),
        Err(LlmError::NoPrompt)
    ));
    assert!(matches!(
        r.decode(&mut greedy(), &no_stops(None), &never, &mut |_| Ok(())),
        Err(LlmError::NoPrompt)
    ));
}

// ---------------------------------------------------------------------------------------------
// Model and Engine: a byte tokenizer over the fixtures' 256-entry vocabulary

/// A compact ChatML-like template (one role letter per turn) so conversations fit the fixtures'
/// 32-token context: each message costs its bytes plus 3 tokens.
const COMPACT_TEMPLATE: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'][0] + m['content'] + '<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>a' }}{% endif %}";

/// Writes tokenizer files for the Llama fixture (ids: 0 `<unk>`, 1 `<s>`, 2 `</s>`,
/// 3 `<|im_start|>`, 4 `<|im_end|>`, 5.. bytes 0x05..0xFF) into `dir`.
fn llama_tokenizer_files(dir: &Path) -> ModelFiles {
    let specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"];
    byte_tokenizer_files(dir, &specials, Some(COMPACT_TEMPLATE), "<s>", "</s>", LLAMA)
}

fn byte_tokenizer_files(
    dir: &Path,
    specials: &[&str],
    template: Option<&str>,
    bos: &str,
    eos: &str,
    program: &str,
) -> ModelFiles {
    let mut vocab = serde_json::Map::new();
    let mut added_tokens = Vec::new();
    // Specials take the ids of the bytes they displace; the rest of the 256 ids are bytes.
    for b in 0..=255u32 {
        match specials.get(b as usize).filter(|s| !s.is_empty()) {
            Some(s) => {
                vocab.insert(s.to_string(), json!(b));
                added_tokens.push(added(b, s));
            }
            None => {
                vocab.insert(format!("<0x{b:02X}>"), json!(b));
            }
        }
    }
    let tj = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added_tokens,
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": specials[0], "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    let tokenizer = dir.join("tokenizer.json");
    std::fs::write(&tokenizer, tj.to_string()).unwrap();
    let mut cfg = json!({"bos_token": bos, "eos_token": eos});
    if let Some(t) = template {
        cfg["chat_template"] = json!(t);
    }
    let config = dir.join("tokenizer_config.json");
    std::fs::write(&config, cfg.to_string()).unwrap();
    ModelFiles {
        program: fixtures().join(program),
        data_files: Vec::new(),
        tokenizer,
        tokenizer_config: Some(config),
    }
}

fn greedy_options(max: Option<usize>) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams::greedy(),
        max_new_tokens: max,
        enable_thinking: false,
    }
}

fn load_options(reserve: usize) -> LoadOptions {
    LoadOptions {
        context: ContextPolicy {
            reserve_tokens: reserve,
        },
        ..LoadOptions::default()
    }
}

/// A greedy chat turn with no cancellation.
fn greedy_chat(model: &mut Model, history: &[Message], max: Option<usize>) -> Completion {
    model
        .chat(
            history,
            &greedy_options(max),
            &CancelToken::new(),
            &mut |_| {},
        )
        .unwrap()
}

/// The bytes the Llama byte tokenizer's ids stand for (ids 5.. are bytes 5..).
fn bytes_of(ids: &[u32]) -> Vec<u8> {
    ids.iter().filter(|&&i| i >= 5).map(|&i| i as u8).collect()
}

#[test]
fn model_streams_whole_characters_even_from_invalid_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::load(llama_tokenizer_files(dir.path()), &load_options(4)).unwrap();
    // Stop ids: the program's EOS (2) and the template's end of turn (4).
    assert_eq!(model.stop_ids(), &[2, 4]);
    let never = CancelToken::new();
    let history = [Message::system("S"), Message::user("hi")];
    let mut texts = Vec::new();
    let c = model
        .chat(&history, &greedy_options(Some(12)), &never, &mut |e| {
            if let Event::Text(t) = e {
                texts.push(t)
            }
        })
        .unwrap();
    // Each message costs its bytes plus 3 tokens, the generation prompt 2: 4 + 5 + 2.
    assert_eq!(
        (
            c.stats.prompt_tokens,
            c.stats.cached_tokens,
            c.stats.generated_tokens
        ),
        (11, 0, 12)
    );
    assert_eq!(texts.concat(), c.text);
    assert!(texts.iter().all(|t| !t.is_empty()));
    // The random fixture emits arbitrary bytes, invalid UTF-8 among them: the text is exactly
    // what `from_utf8_lossy` makes of them, every valid character kept.
    let bytes = bytes_of(&c.tokens);
    assert_eq!(
        bytes.len(),
        c.tokens.len(),
        "no special tokens expected in {:?}",
        c.tokens
    );
    let lossy = String::from_utf8_lossy(&bytes);
    assert!(
        lossy.contains('\u{FFFD}'),
        "expected invalid bytes in this reply: {bytes:x?}"
    );
    assert_eq!(c.text, lossy);
}

#[test]
fn the_thought_channel_is_kept_out_of_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let history = [Message::system("S"), Message::user("hi")];
    // The fixture's greedy reply with plain byte tokens, to learn its ids.
    let mut plain = Model::load(llama_tokenizer_files(dir.path()), &load_options(4)).unwrap();
    let c = greedy_chat(&mut plain, &history, Some(12));
    let prompt = plain.runner().cached_tokens()[..c.stats.prompt_tokens].to_vec();
    let ids = c.tokens;
    // Two of its ids, each once in the reply and never in the prompt, become Gemma 4's thought
    // markers; the program generates the same ids (its prompt's ids are the same).
    let unique = |i: usize| {
        ids[i] >= 5
            && ids.iter().filter(|&&t| t == ids[i]).count() == 1
            && !prompt.contains(&ids[i])
    };
    let open = (1..ids.len())
        .find(|&i| unique(i))
        .expect("an id to open with");
    let close = (open + 2..ids.len())
        .find(|&i| unique(i))
        .expect("an id to close with");
    let mut specials = vec![""; 256];
    specials[..5].copy_from_slice(&["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]);
    specials[ids[open] as usize] = "<|channel>";
    specials[ids[close] as usize] = "<channel|>";
    let files = byte_tokenizer_files(
        dir.path(),
        &specials,
        Some(COMPACT_TEMPLATE),
        "<s>",
        "</s>",
        LLAMA,
    );
    let lossy = |ids: &[u32]| String::from_utf8_lossy(&bytes_of(ids)).into_owned();
    for max in [12, close] {
        let mut model = Model::load(files.clone(), &load_options(4)).unwrap();
        let mut shown = Vec::new();
        let t = model
            .chat(
                &history,
                &greedy_options(Some(max)),
                &CancelToken::new(),
                &mut |e| {
                    if let Event::Text(t) = e {
                        shown.push(t)
                    }
                },
            )
            .unwrap();
        assert_eq!(
            t.tokens,
            ids[..max],
            "the markers changed what the program generates"
        );
        // The answer: the text before the channel, complete, then the text after it; the
        // reasoning: the text inside (to the end where the reply stops before the channel
        // closes). Only the answer streams.
        let after = if max > close {
            lossy(&ids[close + 1..max])
        } else {
            String::new()
        };
        assert_eq!(
            t.text,
            lossy(&ids[..open]) + &after,
            "ids {ids:?}, open {open}, close {close}"
        );
        assert_eq!(t.thinking, lossy(&ids[open + 1..close.min(max)]));
        assert_eq!(shown.concat(), t.text);
    }
}

#[test]
fn model_reuses_the_cache_when_the_next_turn_extends_the_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::load(llama_tokenizer_files(dir.path()), &load_options(4)).unwrap();
    let mut history = vec![Message::system("S"), Message::user("hi")];
    let c1 = greedy_chat(&mut model, &history, Some(2));
    // The reply re-tokenises to the ids generated, so the next prompt starts with the cache.
    let reply_ids = model.tokenizer().encode(&c1.text).unwrap();
    assert_eq!(reply_ids, c1.tokens, "reply {:?}", c1.text);
    let cached = model.runner().cached_tokens().to_vec();
    // The prompt and the reply but its last token (sampled, not yet fed).
    assert_eq!(cached.len(), 11 + 1);

    history.push(Message::assistant(c1.text.clone()));
    history.push(Message::user("ok"));
    let c2 = greedy_chat(&mut model, &history, Some(3));
    let prompt = 4 + 5 + (2 + 3) + 5 + 2;
    assert_eq!(
        (c2.stats.prompt_tokens, c2.stats.cached_tokens),
        (prompt, cached.len())
    );
    assert_eq!(c2.stats.prefilled_tokens, prompt - cached.len());

    // The same conversation on a fresh model (full prefill) gives the same reply.
    let mut fresh = Model::load(llama_tokenizer_files(dir.path()), &load_options(4)).unwrap();
    let c3 = greedy_chat(&mut fresh, &history, Some(3));
    assert_eq!(
        (c3.stats.cached_tokens, c3.stats.prefilled_tokens),
        (0, prompt)
    );
    assert_eq!(c3.tokens, c2.tokens);
}

#[test]
fn a_full_context_drops_the_oldest_turns_but_keeps_the_system_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::load(llama_tokenizer_files(dir.path()), &load_options(4)).unwrap();
    let never = CancelToken::new();
    // 4 + 8 + 8 + 9 + 5 + 2 (generation prompt) = 36 tokens: more than the 32-token context.
    let history = vec![
        Message::system("S"),
        Message::user("first"),
        Message::assistant("reply"),
        Message::user("second"),
        Message::user("hi"),
    ];
    let fitted = model.fit_prompt(&history, false).unwrap();
    // Dropping "first" and its reply leaves 4 + 9 + 5 + 2 = 20 tokens (room for the reserve).
    assert_eq!(fitted.dropped, 2);
    let kept = [
        Message::system("S"),
        Message::user("second"),
        Message::user("hi"),
    ];
    let want = model
        .tokenizer()
        .encode(&model.template().render(&kept, gen_prompt()).unwrap())
        .unwrap();
    assert_eq!(fitted.tokens, want);
    let c = greedy_chat(&mut model, &history, Some(3));
    assert_eq!((c.stats.prompt_tokens, c.stats.dropped_messages), (20, 2));

    // A reply that fills the cache mid-way drops another turn and continues.
    let history = vec![
        Message::system("S"),
        Message::user("one two"),
        Message::user("x"),
    ];
    let c = greedy_chat(&mut model, &history, None);
    // 4 + 10 + 4 + 2 = 20 prompt tokens leave 12 for the reply; the random model never stops,
    // so at 12 the turn "one two" goes: 4 + 4 + 2 + 12 = 22 tokens are prefilled again and the
    // reply goes on for the 10 positions left.
    let s = &c.stats;
    assert_eq!(
        (s.prompt_tokens, s.context_shifts, s.dropped_messages),
        (20, 1, 1)
    );
    assert_eq!(
        (s.generated_tokens, s.prefilled_tokens, s.stop),
        (22, 20 + 22, StopReason::ContextFull)
    );
    // The continuation is what the model gives for the shortened conversation plus the reply so far.
    let shorter = [Message::system("S"), Message::user("x")];
    let mut prompt = model
        .tokenizer()
        .encode(&model.template().render(&shorter, gen_prompt()).unwrap())
        .unwrap();
    prompt.extend(&c.tokens[..12]);
    let (_, rest) = greedy_generate(&mut runner(LLAMA, RunnerConfig::default()), &prompt, None);
    assert_eq!(rest.tokens, c.tokens[12..]);

    // A last message that cannot fit even alone is an error, not a panic.
    let huge = vec![Message::system("S"), Message::user("x".repeat(40))];
    assert!(matches!(
        model.chat(&huge, &greedy_options(None), &never, &mut |_| {}),
        Err(LlmError::PromptTooLong { limit: 32, .. })
    ));
}

#[test]
fn engine_runs_replies_off_thread_swaps_models_and_cancels() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new().unwrap();
    let info = engine
        .load(llama_tokenizer_files(dir.path()), load_options(4))
        .unwrap();
    assert_eq!(
        (info.context_len, info.prefill_chunk, info.stop_ids.clone()),
        (32, 31, vec![2, 4])
    );

    let g = engine
        .chat(vec![Message::user("hi")], greedy_options(Some(5)))
        .unwrap();
    let mut streamed = String::new();
    let c = g.wait(|t| streamed.push_str(t)).unwrap();
    assert_eq!(streamed, c.text);
    assert!(c.stats.time_to_first_token.is_some());

    // A generation queued behind a running one and cancelled before it starts does nothing.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let mut first_event = true;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    engine
        .chat_with(
            vec![Message::user("hi")],
            greedy_options(Some(5)),
            move |e| {
                if first_event {
                    first_event = false;
                    let _ = started_tx.send(());
                    let _ = release_rx.recv();
                }
                if let Event::Finished(c) = e {
                    let _ = done_tx.send(c.stats.stop);
                }
            },
        )
        .unwrap();
    started_rx.recv().unwrap();
    let queued = engine
        .chat(vec![Message::user("hi")], greedy_options(Some(5)))
        .unwrap();
    queued.cancel();
    release_tx.send(()).unwrap();
    assert_ne!(done_rx.recv().unwrap(), StopReason::Cancelled);
    let c = queued.wait(|_| {}).unwrap();
    assert_eq!(
        (c.stats.stop, c.stats.generated_tokens),
        (StopReason::Cancelled, 0)
    );

    // Swap to the Gemma 4 fixture: no template in its config, so the built-in format.
    // Byte tokenizer with Gemma's control ids: 0 <pad>, 1 <eos>, 2 <bos>, 105 <|turn>, 106 <turn|>.
    let gdir = tempfile::tempdir().unwrap();
    let mut specials = vec![""; 107];
    for (i, s) in [
        (0, "<pad>"),
        (1, "<eos>"),
        (2, "<bos>"),
        (105, "<|turn>"),
        (106, "<turn|>"),
    ] {
        specials[i] = s;
    }
    let files = byte_tokenizer_files(gdir.path(), &specials, None, "<bos>", "<eos>", GEMMA);
    let info = engine.load(files, load_options(4)).unwrap();
    assert_eq!(info.stop_ids, vec![1, 106]);
    assert_eq!(info.template, "gemma4 (built-in)");
    let c = engine
        .chat(vec![Message::user("Hello")], greedy_options(Some(4)))
        .unwrap()
        .wait(|_| {})
        .unwrap();
    // <bos><|turn> "user\n" "Hello" <turn|> "\n" <|turn> "model\n" = 2 + 5 + 5 + 2 + 1 + 6 tokens.
    assert_eq!(c.stats.prompt_tokens, 21);

    engine.unload().unwrap();
    let r = engine
        .chat(vec![Message::user("hi")], greedy_options(Some(1)))
        .unwrap()
        .wait(|_| {});
    assert!(matches!(r, Err(LlmError::NoModel)));

    // Loading something that is not a model reports an error and leaves the engine usable.
    let bad = ModelFiles {
        program: PathBuf::from("/nonexistent/model.pte"),
        ..llama_tokenizer_files(dir.path())
    };
    assert!(engine.load(bad, LoadOptions::default()).is_err());
    engine
        .load(llama_tokenizer_files(dir.path()), load_options(4))
        .unwrap();
}

#[test]
fn model_files_are_found_beside_the_program() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ModelFiles::in_dir(dir.path()).is_err());
    std::fs::write(dir.path().join("model.pte"), b"").unwrap();
    // A program without tokenizer.json beside it is an error naming the file.
    let err = ModelFiles::in_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::write(dir.path().join("tokenizer.json"), b"{}").unwrap();
    let f = ModelFiles::in_dir(dir.path()).unwrap();
    assert_eq!(f.program, dir.path().join("model.pte"));
    assert_eq!(f.tokenizer_config, None);
    std::fs::write(dir.path().join("tokenizer_config.json"), b"{}").unwrap();
    assert!(ModelFiles::in_dir(dir.path())
        .unwrap()
        .tokenizer_config
        .is_some());
    std::fs::write(dir.path().join("other.pte"), b"").unwrap();
    assert!(ModelFiles::in_dir(dir.path()).is_err());
}

#[test]
fn load_options_on_a_device_run_delegated_programs_on_the_cpu_and_the_gpu_executor() {
    use pteria::runtime::delegate::Device;
    let never = CancelToken::new();
    let gold = golden("llama_tiny_xnnpack_8da4w.golden.npy");
    // Without the front ends the XNNPACK program does not load at all.
    let refused = Runner::open(
        &fixtures().join("llama_tiny_xnnpack_8da4w.pte"),
        &[],
        &LoadOptions::default().backends,
        &RunnerConfig::default(),
    );
    match refused {
        Err(e) => assert!(e.to_string().contains("XnnpackBackend"), "{e}"),
        Ok(_) => panic!("an XNNPACK program loaded without an XNNPACK backend"),
    }
    for device in [Device::Cpu, Device::Gpu] {
        let (options, _) = LoadOptions::on_device(device).unwrap();
        let mut r = Runner::open(
            &fixtures().join("llama_tiny_xnnpack_8da4w.pte"),
            &[],
            &options.backends,
            &RunnerConfig::default(),
        )
        .unwrap_or_else(|e| panic!("{device:?}: {e}"));
        let mut seq = PROMPT.to_vec();
        r.prefill(&seq, &never, &mut |_, _| {}).unwrap();
        // The manifest's tolerance for this program (int8 dynamic activations round differently).
        let err = rel_l2(r.logits().unwrap(), &gold[0]);
        assert!(err < 1e-2, "{device:?}, prefill: rel L2 {err}");
        for (k, &t) in DECODE.iter().enumerate() {
            seq.push(t);
            r.prefill(&seq, &never, &mut |_, _| {}).unwrap();
            let err = rel_l2(r.logits().unwrap(), &gold[k + 1]);
            assert!(err < 1e-2, "{device:?}, decode {k}: rel L2 {err}");
        }
    }
}

/// On the GPU a decode step hands back only its row's sampling candidates: the same tokens as
/// reading every row, greedy and sampled, and the row itself still there when asked for.
#[test]
fn gpu_decode_picks_from_candidates_what_whole_rows_pick() {
    use pteria::runtime::delegate::Device;
    if std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1") {
        return;
    }
    let (options, _) = LoadOptions::on_device(Device::Gpu).unwrap();
    let never = CancelToken::new();
    let sampled = |top_k, temperature, seed| SamplingParams {
        top_k,
        temperature,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    for file in [
        "gemma4_tiny_vulkan_stock_8da4w_emb4.pte",
        "gemma4_tiny_vulkan_fp32.pte",
    ] {
        for params in [
            SamplingParams::greedy(),
            sampled(64, 1.0, 5),
            sampled(3, 0.7, 9),
        ] {
            let mut runs = Vec::new();
            for full_logits in [true, false] {
                let config = RunnerConfig {
                    full_logits,
                    ..RunnerConfig::default()
                };
                let mut r =
                    Runner::open(&fixtures().join(file), &[], &options.backends, &config).unwrap();
                let mut s = Sampler::new(params.clone()).unwrap();
                let (_, d) = generate_with(&mut r, &mut s, &PROMPT, Some(12));
                // The first token comes from the prompt's row; every later one from its step.
                let picks = if full_logits { 0 } else { d.tokens.len() - 1 };
                assert_eq!(r.candidate_picks(), picks, "{file} {params:?}");
                // Decoding on with Gemma's defaults: candidates gathered for a smaller k (greedy,
                // top-k 3) cannot decide its first pick, so that one reads the row.
                let mut s2 = Sampler::new(sampled(64, 1.0, 21)).unwrap();
                let d2 = r
                    .decode(&mut s2, &no_stops(Some(5)), &never, &mut |_| Ok(()))
                    .unwrap();
                let decided = params.temperature > 0.0 && params.top_k >= 64;
                let more = match (full_logits, decided) {
                    (true, _) => 0,
                    (false, true) => d2.tokens.len(),
                    (false, false) => d2.tokens.len() - 1,
                };
                assert_eq!(r.candidate_picks(), picks + more, "{file} {params:?}");
                runs.push((d.tokens, d2.tokens, r.logits().unwrap().to_vec()));
            }
            assert_eq!(runs[0].0, runs[1].0, "{file} {params:?}");
            assert_eq!(runs[0].1, runs[1].1, "{file} {params:?}: decoding on");
            assert_eq!(runs[0].2, runs[1].2, "{file} {params:?}: the last row");
        }
    }
}

/// Decode on the GPU runs one step ahead (each step fed the last one's pick on the device),
/// greedy and sampled: the same tokens as one step at a time, at every limit, stop token and
/// cancellation, the same last row after it, and the same tokens (and draws) when a later prompt
/// extends the cache past the step that was run ahead and dropped.
#[test]
fn gpu_decode_one_step_ahead_matches_one_at_a_time() {
    use pteria::runtime::delegate::Device;
    if std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1") {
        return;
    }
    let (options, _) = LoadOptions::on_device(Device::Gpu).unwrap();
    let sampled = |temperature, top_k, top_p, min_p, seed| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let settings = [
        SamplingParams::greedy(),
        sampled(1.0, 64, 0.95, 0.0, 5),
        sampled(0.7, 3, 1.0, 0.0, 9),
        sampled(1.3, 40, 0.5, 0.1, 11),
    ];
    let mut drawn_ahead = 0;
    // The MLX fixture's shapes follow the position: each step is recorded anew, after the
    // step in flight finishes (it failed to start before that).
    for file in [
        "gemma4_tiny_vulkan_stock_8da4w_emb4.pte",
        "gemma4_tiny_vulkan_fp32.pte",
        "gemma4_tiny_mlx_int4.pte",
    ] {
        let open = |serial_decode| {
            let config = RunnerConfig {
                serial_decode,
                ..RunnerConfig::default()
            };
            Runner::open(&fixtures().join(file), &[], &options.backends, &config).unwrap()
        };
        for params in &settings {
            let sampler = || Sampler::new(params.clone()).unwrap();
            // The serial run's tokens say which stop token ends a run part-way.
            let mut serial = open(true);
            let (_, all) = generate_with(&mut serial, &mut sampler(), &PROMPT, Some(12));
            assert_eq!(serial.steps_ahead(), 0);
            let stop_at = all.tokens[6];
            let cases: Vec<(String, DecodeOptions, Option<usize>)> = vec![
                ("12 tokens".into(), no_stops(Some(12)), None),
                ("1 token".into(), no_stops(Some(1)), None),
                ("2 tokens".into(), no_stops(Some(2)), None),
                ("3 tokens".into(), no_stops(Some(3)), None),
                (
                    format!("stop at {stop_at}"),
                    DecodeOptions {
                        max_new_tokens: Some(12),
                        stop_ids: vec![stop_at],
                    },
                    None,
                ),
                ("cancelled after 4".into(), no_stops(Some(12)), Some(4)),
            ];
            for (what, opts, cancel_after) in &cases {
                let what = format!("{file} {what} {params:?}");
                let mut runs = Vec::new();
                for serial_decode in [true, false] {
                    let mut r = open(serial_decode);
                    let mut s = sampler();
                    let cancel = CancelToken::new();
                    let mut seen = 0;
                    let (_, d) = r
                        .generate(&PROMPT, &mut s, opts, &cancel, &mut |_| {
                            seen += 1;
                            if Some(seen) == *cancel_after {
                                cancel.cancel();
                            }
                            Ok(())
                        })
                        .unwrap();
                    let (ahead, misses) = (r.steps_ahead(), r.misses_ahead());
                    let row = r.logits().unwrap().to_vec();
                    // A later prompt that extends what is cached, and more tokens after it,
                    // drawn on by the same sampler.
                    let mut prompt = r.cached_tokens().to_vec();
                    prompt.extend([9, 4]);
                    let (p, d2) = generate_with(&mut r, &mut s, &prompt, Some(5));
                    assert!(!p.reset, "{what}: the cache was reused");
                    runs.push((
                        d.tokens,
                        d.stop,
                        row,
                        d2.tokens,
                        r.logits().unwrap().to_vec(),
                    ));
                    if serial_decode {
                        assert_eq!((ahead, misses), (0, 0), "{what}");
                    } else {
                        // Every step after the first two ran ahead: the first from the
                        // prompt's row, the second submitted with it. A sampled one is kept
                        // where the device drew the host's token.
                        let steps = runs.last().unwrap().0.len();
                        let ran = match *cancel_after {
                            None if what.contains("stop at") => steps.saturating_sub(1),
                            _ => steps.saturating_sub(2),
                        };
                        assert_eq!(ahead + misses, ran, "{what}: steps ahead");
                        assert!(misses <= 1, "{what}: {misses} steps ahead dropped");
                        if params.temperature > 0.0 {
                            drawn_ahead += ahead;
                        }
                    }
                }
                assert_eq!(runs[0].0, runs[1].0, "{what}: tokens");
                assert_eq!(runs[0].1, runs[1].1, "{what}: stop");
                assert_eq!(runs[0].2, runs[1].2, "{what}: the last row");
                assert_eq!(runs[0].3, runs[1].3, "{what}: decoding on");
                assert_eq!(runs[0].4, runs[1].4, "{what}: the row after");
            }
        }
    }
    assert!(drawn_ahead > 100, "{drawn_ahead} sampled steps kept ahead");
}

/// Where the candidates never decide a pick (here at most 8 stored of the 256 a top-64 draw
/// over one block gathers), decode one step ahead drops 3 steps and hands over to one step at a
/// time, which, as it does alone, stops asking for candidates after 3 misses: the same tokens
/// and last row as reading every row.
#[test]
fn undecided_candidates_hand_decode_over_to_one_step_at_a_time() {
    if std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1") {
        return;
    }
    let ctx = pteria::gpu::Context::with_options(pteria::gpu::ContextOptions {
        candidate_capacity: Some(8),
        ..Default::default()
    })
    .unwrap();
    let backends = pteria::frontend::backends(pteria::runtime::delegate::gpu_executor(
        std::sync::Arc::new(ctx),
    ));
    let params = SamplingParams {
        seed: Some(5),
        ..SamplingParams::default()
    };
    for file in [
        "gemma4_tiny_vulkan_stock_8da4w_emb4.pte",
        "gemma4_tiny_vulkan_fp32.pte",
    ] {
        let mut runs = Vec::new();
        // Rows always; one step ahead; one step at a time, which reads rows after 3 misses.
        for (full_logits, serial_decode) in [(true, false), (false, false), (false, true)] {
            let config = RunnerConfig {
                full_logits,
                serial_decode,
                ..RunnerConfig::default()
            };
            let mut r = Runner::open(&fixtures().join(file), &[], &backends, &config).unwrap();
            let mut s = Sampler::new(params.clone()).unwrap();
            let (_, d) = generate_with(&mut r, &mut s, &PROMPT, Some(10));
            assert_eq!(d.tokens.len(), 10, "{file}");
            let counts = (r.candidate_picks(), r.steps_ahead(), r.misses_ahead());
            // One step ahead after the prompt's row, dropped 3 times, then rows.
            let ahead = !full_logits && !serial_decode;
            let want = if ahead { (0, 0, 3) } else { (0, 0, 0) };
            assert_eq!(counts, want, "{file}");
            runs.push((d.tokens, r.logits().unwrap().to_vec()));
        }
        assert_eq!(runs[0], runs[1], "{file}: one step ahead");
        assert_eq!(runs[0], runs[2], "{file}: one step at a time");
    }
}

/// Random texts of characters of every UTF-8 length, combining marks, spaces and newlines, up
/// to 240 characters (past the stream's 64-token window): their ids streamed one at a time give
/// the text decoding them all at once gives, on the demo model's byte-level BPE and on a
/// byte-fallback BPE whose byte tokens spell most of it. Random ids too, wherever decoding them
/// all at once leaves no U+FFFD (a character split between ids, which a stream shows as soon as
/// it cannot complete).
#[test]
fn streaming_gives_the_decoded_text_for_random_texts_and_ids() {
    let demo = Tokenizer::from_file(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("assets/models/smollm2-135m-instruct/tokenizer.json"),
    )
    .unwrap();
    let (fallback, _) = byte_fallback_tokenizer(&["▁caf", "é", "▁ok", "!", "▁", "a"], &["<x>"]);
    let pool: Vec<char> = "aZ09 .,!?\n\t<>é€中😀\u{301}ß▁"
        .chars()
        .chain([
            '\u{7F}',
            '\u{80}',
            '\u{7FF}',
            '\u{800}',
            '\u{FFFF}',
            '\u{10000}',
        ])
        .collect();
    let mut rng = common::fuzz::Rng(0x243F_6A88_85A3_08D3);
    let mut next = move |n: usize| rng.below(n);
    let streamed = |tok: &Tokenizer, ids: &[u32]| -> String {
        stream(tok, ids).into_iter().flatten().collect()
    };
    let (mut texts, mut id_runs) = (0, 0);
    for (name, tok) in [("byte-level", &demo), ("byte-fallback", &fallback)] {
        for _ in 0..400 {
            let len = next(240);
            let text: String = (0..len).map(|_| pool[next(pool.len())]).collect();
            let ids = tok.encode(&text).unwrap();
            let want = tok.decode(&ids, true).unwrap();
            assert_eq!(streamed(tok, &ids), want, "{name}: {text:?} as {ids:?}");
            texts += 1;
        }
        let vocab = tok.vocab_size();
        for _ in 0..1000 {
            let ids: Vec<u32> = (0..1 + next(100)).map(|_| next(vocab) as u32).collect();
            let want = tok.decode(&ids, true).unwrap();
            let got = streamed(tok, &ids);
            if !want.contains('\u{FFFD}') {
                assert_eq!(got, want, "{name}: {ids:?}");
                id_runs += 1;
            }
        }
    }
    // Most random id runs of the byte-level vocabulary decode cleanly.
    assert!(
        texts == 800 && id_runs > 300,
        "{texts} texts, {id_runs} id runs"
    );
}
