//! MLX delegate blobs of the fixture programs: every blob parses, its facts match a `flatc` dump of
//! the same blob (executorch 1.5.1 schema), the fork's tag layout is detected on a rewritten copy,
//! and mutated blobs never panic the parser.

mod common;

use common::fuzz::Seed;
use pteria::fb::{self, Table};
use pteria::frontend::mlx::{self, IntOrVid, MlxGraph, Node, NodeKind, ShapeDim, TagTable, Tid};
use pteria::pte::{Program, ScalarType};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Every fixture program with at least one `MLXBackend` delegate, with its blobs.
fn mlx_fixtures() -> Vec<(PathBuf, Program, Vec<Vec<u8>>)> {
    common::delegate_fixtures(mlx::BACKEND_ID)
        .into_iter()
        .map(|(path, program, blobs)| {
            let blobs = blobs.into_iter().map(|(_, _, b)| b.to_vec()).collect();
            (path, program, blobs)
        })
        .collect()
}

fn fixture(name: &str) -> MlxGraph {
    let path = common::fixtures().join(name);
    let program = Program::open(&path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let blobs: Vec<_> = program
        .plans
        .iter()
        .flat_map(|p| &p.delegates)
        .filter(|d| d.id == mlx::BACKEND_ID)
        .collect();
    assert_eq!(blobs.len(), 1, "{name}: one MLX delegate");
    mlx::parse(&blobs[0].data, &program.named_data).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn counts(g: &MlxGraph) -> [u32; 6] {
    [
        g.num_constant_tensors,
        g.num_input_tensors,
        g.num_output_tensors,
        g.num_mutable_buffer_tensors,
        g.num_temp_tensors,
        g.num_values,
    ]
}

fn hist(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn every_mlx_blob_parses_with_consistent_slots_and_constants() {
    for (path, program, blobs) in mlx_fixtures() {
        for blob in blobs {
            let g = mlx::parse(&blob, &program.named_data)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = path.display();
            assert_eq!(g.version, "1");
            assert_eq!(
                g.tag_table,
                TagTable::Executorch151,
                "{name}: exported by executorch 1.5.1"
            );
            assert_eq!(g.main_chain_idx, 0, "{name}");
            let total: usize = g.chains.iter().map(Vec::len).sum();
            assert_eq!(g.node_histogram().values().sum::<usize>(), total);
            assert!(
                g.main_chain()
                    .iter()
                    .all(|n| !matches!(n, Node::Unsupported { .. })),
                "{name}"
            );
            // Tid layout: inputs, then outputs, then mutable buffers follow the constants.
            let c = g.num_constant_tensors;
            let first_in = c;
            let first_out = c + g.num_input_tensors;
            let first_mut = first_out + g.num_output_tensors;
            assert!(g
                .input_map
                .iter()
                .all(|s| s.idx >= first_in && s.idx < first_out));
            assert!(g
                .output_map
                .iter()
                .all(|s| s.idx >= first_out && s.idx < first_mut));
            assert_eq!(
                g.tensor_meta.len() as u32,
                first_mut + g.num_mutable_buffer_tensors
            );
            // Every constant's named data holds exactly its static shape's bytes.
            for tid in 0..c {
                let data = g.constant_data(Tid(tid), &program.named_data).unwrap();
                let meta = &g.tensor_meta[tid as usize];
                let want = meta.static_numel().unwrap() * meta.dtype.size();
                assert_eq!(
                    data.len(),
                    want,
                    "{name}: constant {tid} `{}`",
                    g.constant_name(Tid(tid)).unwrap()
                );
                assert!(
                    g.constant_name(Tid(tid)).unwrap().contains('/'),
                    "keys are <prefix>/<fqn>"
                );
            }
            // Mutable buffers (the KV caches) have static shapes to allocate.
            for s in &g.mutable_buffer_map {
                assert!(g.tensor_meta[s.idx as usize].static_numel().is_some());
            }
        }
    }
}

/// Facts from `flatc --json` on the blob of `gemma4_tiny_mlx_int4.pte` (export_fixtures.py).
#[test]
fn gemma4_tiny_mlx_int4_matches_its_flatc_dump() {
    let g = fixture("gemma4_tiny_mlx_int4.pte");
    assert_eq!(counts(&g), [231, 2, 1, 8, 23, 3]);
    assert_eq!(
        g.chains.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![455, 52]
    );
    assert_eq!(g.init_chain_idx, Some(1));
    assert_eq!(
        g.node_histogram(),
        hist(&[
            ("AddIntNode", 1),
            ("AddNode", 36),
            ("AddmmNode", 12),
            ("AsTypeNode", 1),
            ("BroadcastToNode", 8),
            ("ClipNode", 12),
            ("ConcatenateNode", 16),
            ("ContiguousNode", 8),
            ("CosNode", 6),
            ("DivideNode", 1),
            ("ExpandDimsNode", 36),
            ("FullLikeNode", 1),
            ("GeluNode", 12),
            ("GreaterEqualNode", 1),
            ("IdCopyNode", 8),
            ("ItemIntNode", 1),
            ("LessNode", 1),
            ("LogicalAndNode", 1),
            ("MultiplyNode", 55 + 52),
            ("NegNode", 10),
            ("QuantizedMatmulNode", 52),
            ("RMSNormNode", 46),
            ("ReshapeNode", 31),
            ("SinNode", 6),
            ("SliceNode", 42),
            ("SliceUpdateNode", 8),
            ("SoftmaxNode", 6),
            ("SymSizeNode", 1),
            ("TakeNode", 9),
            ("TanhNode", 1),
            ("TransposeNode", 25),
            ("WhereNode", 1),
        ])
    );
    // The init chain derives each int4 linear's biases (zero zero-points): biases = scales * -8,
    // written into a constant "..._to_biases_dummy" slot that the main chain's matmul reads.
    let init = g.init_chain().unwrap();
    assert!(init.iter().all(|n| n.kind() == NodeKind::Multiply));
    let mut qmm = 0;
    for n in g.main_chain() {
        if let Node::QuantizedMatmul {
            w,
            scales,
            biases,
            group_size,
            bits,
            mode,
            transpose,
            ..
        } = n
        {
            qmm += 1;
            assert_eq!(
                (*group_size, *bits, mode.as_str(), *transpose),
                (32, 4, "affine", true)
            );
            assert_eq!(
                g.meta(*w).unwrap().dtype,
                ScalarType::UInt32,
                "MLX-packed int4 words"
            );
            assert_eq!(g.meta(*scales).unwrap().dtype, ScalarType::Float);
            let b = biases.expect("affine biases");
            assert!(g.constant_name(b).unwrap().ends_with("_to_biases_dummy"));
            assert!(init
                .iter()
                .any(|n| matches!(n, Node::Binary { out, .. } if *out == b)));
        }
    }
    assert_eq!(qmm, 52);
    let names: Vec<_> = g.named_slots.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names[0].ends_with("/model.model.self_decoder.embed_tokens.weight"),
        "{}",
        names[0]
    );
    assert_eq!(g.named_slots.len(), 242);
    check_io_and_cache(&g);
}

/// Facts from `flatc --json` on the blob of `gemma4_tiny_mlx_fp32.pte`.
#[test]
fn gemma4_tiny_mlx_fp32_matches_its_flatc_dump() {
    let g = fixture("gemma4_tiny_mlx_fp32.pte");
    assert_eq!(counts(&g), [126, 2, 1, 8, 23, 3]);
    assert_eq!(g.chains.iter().map(Vec::len).collect::<Vec<_>>(), vec![507]);
    assert_eq!(g.init_chain_idx, None);
    let h = g.node_histogram();
    assert_eq!(h["AddmmNode"], 64);
    assert_eq!(h["TransposeNode"], 77);
    assert_eq!(h["RMSNormNode"], 46);
    assert_eq!(h["SliceUpdateNode"], 8);
    assert!(!h.contains_key("QuantizedMatmulNode"));
    check_io_and_cache(&g);
}

/// Both Gemma fixtures: tokens/input_pos inputs with a dynamic T in [2, 31], logits out, and each
/// KV cache updated by a `SliceUpdate` along S at a runtime position into a temp, which an `IdCopy`
/// at the end of the chain copies back into the cache.
fn check_io_and_cache(g: &MlxGraph) {
    let c = g.num_constant_tensors;
    let idx: Vec<u32> = g.input_map.iter().map(|s| s.idx).collect();
    assert_eq!(idx, vec![c, c + 1]);
    assert_eq!(g.output_map[0].idx, c + 2);
    let tokens = g.meta(Tid(c)).unwrap();
    assert_eq!(tokens.dtype, ScalarType::Long);
    assert_eq!(
        tokens.shape,
        vec![
            ShapeDim::Static(1),
            ShapeDim::Dynamic {
                min: 2,
                max: Some(31)
            }
        ]
    );
    let caches: BTreeSet<Tid> = g.mutable_buffer_map.iter().map(|s| Tid(s.idx)).collect();
    assert_eq!(caches.len(), 8);
    let main = g.main_chain();
    // The first instruction reads T from the tokens; the embedding is a Take with a tensor index.
    assert_eq!(
        main[0],
        Node::SymSize {
            a: Tid(c),
            dim: 1,
            out: mlx::Vid(0)
        }
    );
    assert!(main.iter().any(
        |n| matches!(n, Node::Take { index: mlx::IntOrVidOrTid::Tid(t), .. } if *t == Tid(c))
    ));
    let mut updated = BTreeSet::new();
    for n in main {
        if let Node::SliceUpdate {
            dst,
            out,
            axis,
            start,
            stop,
            step,
            ..
        } = n
        {
            updated.insert(*dst);
            assert_eq!(g.tensor_class(*out), Some(mlx::TensorClass::Temp));
            assert_eq!(*axis, IntOrVid::Int(2), "BHSD caches are written along S");
            assert!(
                matches!((start, stop, step), (IntOrVid::Vid(_), IntOrVid::Vid(_), 1)),
                "at runtime positions"
            );
        }
    }
    assert_eq!(updated, caches);
    let tail = &main[main.len() - 8..];
    let copied: BTreeSet<Tid> = tail
        .iter()
        .map(|n| match n {
            Node::IdCopy { out, .. } => *out,
            other => panic!("chain ends with {other:?}"),
        })
        .collect();
    assert_eq!(copied, caches);
}

/// Absolute blob positions of every instruction's union type byte, found by walking the
/// flatbuffer with Pteria's reader (root slot 7 = instruction_chains, chain slot 0, op_type slot 0).
fn op_type_positions(blob: &[u8]) -> Vec<usize> {
    let end = u64::from_le_bytes(blob[8..16].try_into().unwrap()) as usize;
    let buf = &blob[mlx::HEADER_LEN..end];
    let root = Table::root(buf).unwrap();
    let chains = root.tables(7).unwrap().unwrap();
    let mut out = Vec::new();
    for c in chains.iter() {
        let instrs = c.unwrap().tables(0).unwrap().unwrap();
        for ins in instrs.iter() {
            let pos = ins.unwrap().pos();
            let vtable = (pos as i64 - fb::read_i32(buf, pos).unwrap() as i64) as usize;
            let off = fb::read_u16(buf, vtable + 4).unwrap() as usize;
            assert_ne!(off, 0, "every instruction has an op_type");
            out.push(mlx::HEADER_LEN + pos + off);
        }
    }
    out
}

/// The blob as the Software Mansion fork would have written the same graph: CumMaxNode is its tag
/// 112, so every tag from 112 on is one higher.
fn as_fork_blob(blob: &[u8]) -> (Vec<u8>, usize) {
    let mut fork = blob.to_vec();
    let mut moved = 0;
    for p in op_type_positions(blob) {
        let kind = TagTable::Executorch151.kind(blob[p]).unwrap();
        let tag = TagTable::SwmFork
            .tag(kind)
            .expect("kind exists in the fork");
        moved += usize::from(tag != blob[p]);
        fork[p] = tag;
    }
    (fork, moved)
}

#[test]
fn fork_tag_layout_is_detected_on_a_rewritten_fixture() {
    let mut rewritten = 0;
    for (path, program, blobs) in mlx_fixtures() {
        for blob in blobs {
            let up = mlx::parse(&blob, &program.named_data).unwrap();
            let (fork_blob, moved) = as_fork_blob(&blob);
            match mlx::parse(&fork_blob, &program.named_data) {
                Ok(fork) => {
                    assert_eq!(fork.chains, up.chains, "{}", path.display());
                    if moved > 0 {
                        rewritten += 1;
                        assert_eq!(fork.tag_table, TagTable::SwmFork, "{}", path.display());
                    } else {
                        // No tag from 112 on: the two layouts read identically.
                        assert_eq!(fork.tag_table, TagTable::Executorch151);
                    }
                }
                // Some shifted tags land on a kind with the same fields (BitwiseAnd at 129 is
                // BitwiseOr's tag in the fork): if nothing else tells the orders apart, the
                // reader must refuse rather than guess.
                Err(e @ mlx::MlxError::AmbiguousTagLayout { .. }) => {
                    assert!(moved > 0, "{}: {e}", path.display());
                }
                Err(e) => panic!("{} as the fork wrote it: {e}", path.display()),
            }
            // A tag beyond both tables is refused, naming the mismatch.
            let mut bad = blob.clone();
            bad[op_type_positions(&blob)[0]] = 200;
            let e = mlx::parse(&bad, &program.named_data)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("MLX node union tag 200 is beyond the 1.5.1 table (136 kinds)"),
                "{e}"
            );
        }
    }
    assert!(
        rewritten > 0,
        "no fixture uses a tag from 112 on (QuantizedMatmulNode is 121)"
    );
}

#[test]
fn mutated_mlx_blobs_never_panic_in_parsing_or_lowering() {
    let (mut seeds, mut named, mut owner) = (Vec::new(), Vec::new(), Vec::new());
    for (_, program, blobs) in mlx_fixtures() {
        for blob in blobs {
            // Union tags, where layout detection happens, are hot.
            let tags = op_type_positions(&blob);
            let (fork, _) = as_fork_blob(&blob);
            let name = format!("mlx blob {}", seeds.len() / 2);
            seeds.push(Seed::new(format!("{name} (fork layout)"), fork).with_hot(tags.clone()));
            seeds.push(Seed::new(name, blob).with_hot(tags));
            owner.extend([named.len(); 2]);
        }
        named.push(program.named_data.clone());
    }
    let per_seed = common::fuzz::iters(1000);
    // Whatever parses must also lower (or be refused) without a panic.
    common::fuzz::run(
        "mlx blob",
        &seeds,
        per_seed,
        0xA076_1D64_78BD_642F,
        |si, m| {
            let named = &named[owner[si]];
            match mlx::parse(&m, named) {
                Ok(g) => {
                    let _ = mlx::lower::lower(&g, named);
                    true
                }
                Err(_) => false,
            }
        },
    );
}
