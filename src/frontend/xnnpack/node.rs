//! `XNode`s: the `XNodeUnion` member tables decoded into `NodeKind`, one variant per union member,
//! in the schema's tag order. Value ids stay as the blob's `id_out` numbers; the graph checks that
//! each one names a value.

use super::value::INVALID_ID;
use super::{Result, XnnError};
use crate::fb::{FbError, Table};

/// `OutputMinMax`: the clamp applied to a node's output (absent means ±infinity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputMinMax {
    pub output_min: f32,
    pub output_max: f32,
}

/// `XNode`.
#[derive(Debug, Clone)]
pub struct XNode {
    pub kind: NodeKind,
    /// Links the node back to the exported graph.
    pub debug_handle: u32,
    pub output_min_max: Option<OutputMinMax>,
}

/// `_XNNNode1x1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unary {
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `_XNNNode2x1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    pub input1_id: u32,
    pub input2_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNFullyConnected`: `output = input1 · filterᵀ + bias`, filter `[N, K]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullyConnected {
    pub input1_id: u32,
    pub filter_id: u32,
    /// None when the blob stores `XNN_INVALID_VALUE_ID` (no bias).
    pub bias_id: Option<u32>,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNStaticTranspose`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticTranspose {
    pub perm: Vec<u32>,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNStaticResizeBilinear2D`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticResizeBilinear2d {
    pub new_height: u32,
    pub new_width: u32,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNStaticConstantPad`.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticConstantPad {
    pub pre_paddings: Vec<u32>,
    pub post_paddings: Vec<u32>,
    pub padding_value: f32,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `_XNNNodeConv` (Conv2d, DepthwiseConv2d, ConvTranspose2d).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conv {
    pub padding_top: u32,
    pub padding_right: u32,
    pub padding_bottom: u32,
    pub padding_left: u32,
    pub kernel_height: u32,
    pub kernel_width: u32,
    pub subsampling_height: u32,
    pub subsampling_width: u32,
    pub dilation_height: u32,
    pub dilation_width: u32,
    pub group_input_channels: u32,
    pub group_output_channels: u32,
    pub groups: u32,
    pub adjustment_height: u32,
    pub adjustment_width: u32,
    pub input1_id: u32,
    pub filter_id: u32,
    pub bias_id: Option<u32>,
    pub output_id: u32,
    pub flags: u32,
}

/// `_XNNPooling2D` (AvgPooling2d, MaxPooling2d).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooling2d {
    pub padding_top: u32,
    pub padding_right: u32,
    pub padding_bottom: u32,
    pub padding_left: u32,
    pub pooling_height: u32,
    pub pooling_width: u32,
    pub stride_height: u32,
    pub stride_width: u32,
    pub dilation_height: u32,
    pub dilation_width: u32,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNArgMaxPooling2d`: two outputs, the maxima and their indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgMaxPooling2d {
    pub padding_top: u32,
    pub padding_right: u32,
    pub padding_bottom: u32,
    pub padding_left: u32,
    pub pooling_height: u32,
    pub pooling_width: u32,
    pub input_id: u32,
    pub output_value_id: u32,
    pub output_index_id: u32,
    pub flags: u32,
}

/// `XNNStaticReshape`. A 0 in `new_shape` is XNNPACK's "infer this dimension".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticReshape {
    pub new_shape: Vec<u32>,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNLeakyReLU`.
#[derive(Debug, Clone, PartialEq)]
pub struct LeakyRelu {
    pub negative_slope: f32,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNELU`.
#[derive(Debug, Clone, PartialEq)]
pub struct Elu {
    pub alpha: f32,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `_XNNCat`, keeping only the inputs its arity uses (`XNNConcatenateN` reads `input1..N`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concatenate {
    pub axis: u32,
    pub input_ids: Vec<u32>,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNStaticSlice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticSlice {
    pub offsets: Vec<u32>,
    pub sizes: Vec<u32>,
    pub input_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNNScaledDotProductAttention`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaledDotProductAttention {
    pub query_id: u32,
    pub key_id: u32,
    pub value_id: u32,
    pub scale_id: u32,
    pub mask_id: u32,
    pub output_id: u32,
    pub flags: u32,
}

/// `XNodeUnion`, every member, in tag order (1-based).
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Add(Binary),
    FullyConnected(FullyConnected),
    Softmax(Unary),
    Sigmoid(Unary),
    StaticTranspose(StaticTranspose),
    Clamp(Unary),
    Conv2d(Conv),
    Div(Binary),
    StaticResizeBilinear2d(StaticResizeBilinear2d),
    StaticConstantPad(StaticConstantPad),
    AvgPooling2d(Pooling2d),
    Minimum(Binary),
    DepthwiseConv2d(Conv),
    MaxPooling2d(Pooling2d),
    Multiply(Binary),
    Subtract(Binary),
    Floor(Unary),
    Convert(Unary),
    GlobalAvgPooling2d(Unary),
    StaticReshape(StaticReshape),
    ArgMaxPooling2d(ArgMaxPooling2d),
    SquareRoot(Unary),
    Ceiling(Unary),
    Hardswish(Unary),
    LeakyRelu(LeakyRelu),
    Maximum(Binary),
    Negate(Unary),
    Square(Unary),
    Elu(Elu),
    Abs(Unary),
    Prelu(Binary),
    Concatenate2(Concatenate),
    Concatenate3(Concatenate),
    Concatenate4(Concatenate),
    StaticSlice(StaticSlice),
    ScaledDotProductAttention(ScaledDotProductAttention),
    BatchMatrixMultiply(Binary),
    Concatenate5(Concatenate),
    ConvTranspose2d(Conv),
    ReciprocalSquareRoot(Unary),
    Log(Unary),
    Gelu(Unary),
    Tanh(Unary),
    Exp(Unary),
    Sin(Unary),
    Copy(Unary),
    Cos(Unary),
}

/// `(field name, value id)` pairs, in schema order.
pub type FieldIds = Vec<(&'static str, u32)>;

/// Union member names by tag (index = tag - 1), as the schema spells them.
const NAMES: [&str; 47] = [
    "XNNAdd",
    "XNNFullyConnected",
    "XNNSoftmax",
    "XNNSigmoid",
    "XNNStaticTranspose",
    "XNNClamp",
    "XNNConv2d",
    "XNNDiv",
    "XNNStaticResizeBilinear2D",
    "XNNStaticConstantPad",
    "XNNAvgPooling2d",
    "XNNMinimum",
    "XNNDepthwiseConv2d",
    "XNNMaxPooling2d",
    "XNNMultiply",
    "XNNSubtract",
    "XNNFloor",
    "XNNConvert",
    "XNNGlobalAvgPooling2d",
    "XNNStaticReshape",
    "XNNArgMaxPooling2d",
    "XNNSquareRoot",
    "XNNCeiling",
    "XNNHardswish",
    "XNNLeakyReLU",
    "XNNMaximum",
    "XNNNegate",
    "XNNSquare",
    "XNNELU",
    "XNNAbs",
    "XNNPReLU",
    "XNNConcatenate2",
    "XNNConcatenate3",
    "XNNConcatenate4",
    "XNNStaticSlice",
    "XNNScaledDotProductAttention",
    "XNNBatchMatrixMultiply",
    "XNNConcatenate5",
    "XNNConvTranspose2d",
    "XNNReciprocalSquareRoot",
    "XNNLog",
    "XNNGelu",
    "XNNTanh",
    "XNNExp",
    "XNNSin",
    "XNNCopy",
    "XNNCos",
];

/// The schema name of a union tag, if the tag is known.
pub fn tag_name(tag: u8) -> Option<&'static str> {
    (tag as usize)
        .checked_sub(1)
        .and_then(|i| NAMES.get(i))
        .copied()
}

impl NodeKind {
    /// The `XNodeUnion` tag.
    pub fn tag(&self) -> u8 {
        use NodeKind::*;
        match self {
            Add(_) => 1,
            FullyConnected(_) => 2,
            Softmax(_) => 3,
            Sigmoid(_) => 4,
            StaticTranspose(_) => 5,
            Clamp(_) => 6,
            Conv2d(_) => 7,
            Div(_) => 8,
            StaticResizeBilinear2d(_) => 9,
            StaticConstantPad(_) => 10,
            AvgPooling2d(_) => 11,
            Minimum(_) => 12,
            DepthwiseConv2d(_) => 13,
            MaxPooling2d(_) => 14,
            Multiply(_) => 15,
            Subtract(_) => 16,
            Floor(_) => 17,
            Convert(_) => 18,
            GlobalAvgPooling2d(_) => 19,
            StaticReshape(_) => 20,
            ArgMaxPooling2d(_) => 21,
            SquareRoot(_) => 22,
            Ceiling(_) => 23,
            Hardswish(_) => 24,
            LeakyRelu(_) => 25,
            Maximum(_) => 26,
            Negate(_) => 27,
            Square(_) => 28,
            Elu(_) => 29,
            Abs(_) => 30,
            Prelu(_) => 31,
            Concatenate2(_) => 32,
            Concatenate3(_) => 33,
            Concatenate4(_) => 34,
            StaticSlice(_) => 35,
            ScaledDotProductAttention(_) => 36,
            BatchMatrixMultiply(_) => 37,
            Concatenate5(_) => 38,
            ConvTranspose2d(_) => 39,
            ReciprocalSquareRoot(_) => 40,
            Log(_) => 41,
            Gelu(_) => 42,
            Tanh(_) => 43,
            Exp(_) => 44,
            Sin(_) => 45,
            Copy(_) => 46,
            Cos(_) => 47,
        }
    }

    /// The schema's union member name, e.g. `XNNFullyConnected`.
    pub fn name(&self) -> &'static str {
        NAMES[self.tag() as usize - 1]
    }

    /// `(field name, value id)` for each input the node reads, in schema order; absent optional
    /// inputs (a bias of `XNN_INVALID_VALUE_ID`) are left out.
    pub fn input_fields(&self) -> FieldIds {
        self.fields().0
    }

    /// `(field name, value id)` for each output the node writes.
    pub fn output_fields(&self) -> FieldIds {
        self.fields().1
    }

    /// The input and the output fields, from one match so that a member is listed once.
    fn fields(&self) -> (FieldIds, FieldIds) {
        use NodeKind::*;
        let input = |id| vec![("input_id", id)];
        let output = |id| vec![("output_id", id)];
        match self {
            Add(b)
            | Div(b)
            | Minimum(b)
            | Multiply(b)
            | Subtract(b)
            | Maximum(b)
            | Prelu(b)
            | BatchMatrixMultiply(b) => (
                vec![("input1_id", b.input1_id), ("input2_id", b.input2_id)],
                output(b.output_id),
            ),
            Softmax(u)
            | Sigmoid(u)
            | Clamp(u)
            | Floor(u)
            | Convert(u)
            | GlobalAvgPooling2d(u)
            | SquareRoot(u)
            | Ceiling(u)
            | Hardswish(u)
            | Negate(u)
            | Square(u)
            | Abs(u)
            | ReciprocalSquareRoot(u)
            | Log(u)
            | Gelu(u)
            | Tanh(u)
            | Exp(u)
            | Sin(u)
            | Copy(u)
            | Cos(u) => (input(u.input_id), output(u.output_id)),
            FullyConnected(f) => {
                let mut v = vec![("input1_id", f.input1_id), ("filter_id", f.filter_id)];
                v.extend(f.bias_id.map(|b| ("bias_id", b)));
                (v, output(f.output_id))
            }
            Conv2d(c) | DepthwiseConv2d(c) | ConvTranspose2d(c) => {
                let mut v = vec![("input1_id", c.input1_id), ("filter_id", c.filter_id)];
                v.extend(c.bias_id.map(|b| ("bias_id", b)));
                (v, output(c.output_id))
            }
            StaticTranspose(n) => (input(n.input_id), output(n.output_id)),
            StaticResizeBilinear2d(n) => (input(n.input_id), output(n.output_id)),
            StaticConstantPad(n) => (input(n.input_id), output(n.output_id)),
            AvgPooling2d(n) | MaxPooling2d(n) => (input(n.input_id), output(n.output_id)),
            StaticReshape(n) => (input(n.input_id), output(n.output_id)),
            ArgMaxPooling2d(n) => (
                input(n.input_id),
                vec![
                    ("output_value_id", n.output_value_id),
                    ("output_index_id", n.output_index_id),
                ],
            ),
            LeakyRelu(n) => (input(n.input_id), output(n.output_id)),
            Elu(n) => (input(n.input_id), output(n.output_id)),
            StaticSlice(n) => (input(n.input_id), output(n.output_id)),
            Concatenate2(c) | Concatenate3(c) | Concatenate4(c) | Concatenate5(c) => {
                const FIELDS: [&str; 5] = [
                    "input1_id",
                    "input2_id",
                    "input3_id",
                    "input4_id",
                    "input5_id",
                ];
                let v = FIELDS
                    .iter()
                    .copied()
                    .zip(c.input_ids.iter().copied())
                    .collect();
                (v, output(c.output_id))
            }
            ScaledDotProductAttention(s) => (
                vec![
                    ("query_id", s.query_id),
                    ("key_id", s.key_id),
                    ("value_id", s.value_id),
                    ("scale_id", s.scale_id),
                    ("mask_id", s.mask_id),
                ],
                output(s.output_id),
            ),
        }
    }

    /// Value ids the node reads.
    pub fn inputs(&self) -> Vec<u32> {
        self.input_fields().into_iter().map(|(_, id)| id).collect()
    }

    /// Value ids the node writes.
    pub fn outputs(&self) -> Vec<u32> {
        self.output_fields().into_iter().map(|(_, id)| id).collect()
    }
}

/// Reads one node table, turning flatbuffer errors into errors that name the node and field.
struct Fields<'a, 'c> {
    t: Table<'a>,
    at: &'c str,
}

impl Fields<'_, '_> {
    fn err(&self, field: &str, e: FbError) -> XnnError {
        XnnError::fb(format!("{}.{field}", self.at), e)
    }
    fn u32(&self, slot: usize, field: &str) -> Result<u32> {
        self.t.scalar(slot, 0u32).map_err(|e| self.err(field, e))
    }
    fn f32(&self, slot: usize, field: &str) -> Result<f32> {
        self.t.scalar(slot, 0f32).map_err(|e| self.err(field, e))
    }
    fn u32s(&self, slot: usize, field: &str) -> Result<Vec<u32>> {
        self.t.vec_of(slot).map_err(|e| self.err(field, e))
    }
    fn optional(&self, slot: usize, field: &str) -> Result<Option<u32>> {
        Ok(Some(self.u32(slot, field)?).filter(|&id| id != INVALID_ID))
    }
    /// A `num_dims` field that must match the length of the vectors that follow it (the C++
    /// runtime reads `num_dims` entries from them).
    fn check_num_dims(&self, num_dims: u32, field: &str, len: usize) -> Result<()> {
        if num_dims as usize != len {
            return Err(XnnError::invalid(
                self.at,
                format!("num_dims is {num_dims} but {field} has {len} entries"),
            ));
        }
        Ok(())
    }

    fn unary(&self) -> Result<Unary> {
        Ok(Unary {
            input_id: self.u32(0, "input_id")?,
            output_id: self.u32(1, "output_id")?,
            flags: self.u32(2, "flags")?,
        })
    }
    fn binary(&self) -> Result<Binary> {
        Ok(Binary {
            input1_id: self.u32(0, "input1_id")?,
            input2_id: self.u32(1, "input2_id")?,
            output_id: self.u32(2, "output_id")?,
            flags: self.u32(3, "flags")?,
        })
    }
    fn conv(&self) -> Result<Conv> {
        Ok(Conv {
            padding_top: self.u32(0, "padding_top")?,
            padding_right: self.u32(1, "padding_right")?,
            padding_bottom: self.u32(2, "padding_bottom")?,
            padding_left: self.u32(3, "padding_left")?,
            kernel_height: self.u32(4, "kernel_height")?,
            kernel_width: self.u32(5, "kernel_width")?,
            subsampling_height: self.u32(6, "subsampling_height")?,
            subsampling_width: self.u32(7, "subsampling_width")?,
            dilation_height: self.u32(8, "dilation_height")?,
            dilation_width: self.u32(9, "dilation_width")?,
            group_input_channels: self.u32(10, "group_input_channels")?,
            group_output_channels: self.u32(11, "group_output_channels")?,
            groups: self.u32(12, "groups")?,
            adjustment_height: self.u32(13, "adjustment_height")?,
            adjustment_width: self.u32(14, "adjustment_width")?,
            input1_id: self.u32(15, "input1_id")?,
            filter_id: self.u32(16, "filter_id")?,
            bias_id: self.optional(17, "bias_id")?,
            output_id: self.u32(18, "output_id")?,
            flags: self.u32(19, "flags")?,
        })
    }
    fn pooling(&self) -> Result<Pooling2d> {
        Ok(Pooling2d {
            padding_top: self.u32(0, "padding_top")?,
            padding_right: self.u32(1, "padding_right")?,
            padding_bottom: self.u32(2, "padding_bottom")?,
            padding_left: self.u32(3, "padding_left")?,
            pooling_height: self.u32(4, "pooling_height")?,
            pooling_width: self.u32(5, "pooling_width")?,
            stride_height: self.u32(6, "stride_height")?,
            stride_width: self.u32(7, "stride_width")?,
            dilation_height: self.u32(8, "dilation_height")?,
            dilation_width: self.u32(9, "dilation_width")?,
            input_id: self.u32(10, "input_id")?,
            output_id: self.u32(11, "output_id")?,
            flags: self.u32(12, "flags")?,
        })
    }
    fn concatenate(&self, arity: usize) -> Result<Concatenate> {
        // _XNNCat: axis 0, input1..4 1..4, output_id 5, flags 6, input5_id 7 (appended later).
        const SLOTS: [(usize, &str); 5] = [
            (1, "input1_id"),
            (2, "input2_id"),
            (3, "input3_id"),
            (4, "input4_id"),
            (7, "input5_id"),
        ];
        let input_ids = SLOTS[..arity]
            .iter()
            .map(|&(slot, name)| self.u32(slot, name))
            .collect::<Result<Vec<_>>>()?;
        Ok(Concatenate {
            axis: self.u32(0, "axis")?,
            input_ids,
            output_id: self.u32(5, "output_id")?,
            flags: self.u32(6, "flags")?,
        })
    }
}

/// Decodes `xnodes[index]`.
pub(super) fn decode(index: usize, t: Table<'_>) -> Result<XNode> {
    let at = format!("xnodes[{index}]");
    let fbe = |e| XnnError::fb(at.clone(), e);
    // XNode: xnode_union 0 (type) + 1 (value), debug_handle 2, output_min_max 3 (a table).
    let Some((tag, u)) = t.union(0).map_err(fbe)? else {
        return Err(XnnError::invalid(&at, "has no node (XNodeUnion is NONE)"));
    };
    let Some(name) = tag_name(tag) else {
        return Err(XnnError::UnknownTag {
            what: "XNodeUnion",
            tag: tag.into(),
            at,
        });
    };
    let debug_handle: u32 = t.scalar(2, 0).map_err(fbe)?;
    let output_min_max = match t.table(3).map_err(fbe)? {
        Some(m) => Some(OutputMinMax {
            output_min: m.scalar(0, 0.0).map_err(fbe)?,
            output_max: m.scalar(1, 0.0).map_err(fbe)?,
        }),
        None => None,
    };
    let at = format!("{at} ({name})");
    let f = Fields { t: u, at: &at };
    use NodeKind::*;
    let kind = match tag {
        1 => Add(f.binary()?),
        2 => FullyConnected(self::FullyConnected {
            input1_id: f.u32(0, "input1_id")?,
            filter_id: f.u32(1, "filter_id")?,
            bias_id: f.optional(2, "bias_id")?,
            output_id: f.u32(3, "output_id")?,
            flags: f.u32(4, "flags")?,
        }),
        3 => Softmax(f.unary()?),
        4 => Sigmoid(f.unary()?),
        5 => {
            let num_dims = f.u32(0, "num_dims")?;
            let perm = f.u32s(1, "perm")?;
            f.check_num_dims(num_dims, "perm", perm.len())?;
            StaticTranspose(self::StaticTranspose {
                perm,
                input_id: f.u32(2, "input_id")?,
                output_id: f.u32(3, "output_id")?,
                flags: f.u32(4, "flags")?,
            })
        }
        6 => Clamp(f.unary()?),
        7 => Conv2d(f.conv()?),
        8 => Div(f.binary()?),
        9 => StaticResizeBilinear2d(self::StaticResizeBilinear2d {
            new_height: f.u32(0, "new_height")?,
            new_width: f.u32(1, "new_width")?,
            input_id: f.u32(2, "input_id")?,
            output_id: f.u32(3, "output_id")?,
            flags: f.u32(4, "flags")?,
        }),
        10 => {
            let pre_paddings = f.u32s(0, "pre_paddings")?;
            let post_paddings = f.u32s(1, "post_paddings")?;
            if pre_paddings.len() != post_paddings.len() {
                return Err(XnnError::invalid(
                    &at,
                    format!(
                        "pre_paddings has {} entries but post_paddings has {}",
                        pre_paddings.len(),
                        post_paddings.len()
                    ),
                ));
            }
            StaticConstantPad(self::StaticConstantPad {
                pre_paddings,
                post_paddings,
                padding_value: f.f32(2, "padding_value")?,
                input_id: f.u32(3, "input_id")?,
                output_id: f.u32(4, "output_id")?,
                flags: f.u32(5, "flags")?,
            })
        }
        11 => AvgPooling2d(f.pooling()?),
        12 => Minimum(f.binary()?),
        13 => DepthwiseConv2d(f.conv()?),
        14 => MaxPooling2d(f.pooling()?),
        15 => Multiply(f.binary()?),
        16 => Subtract(f.binary()?),
        17 => Floor(f.unary()?),
        18 => Convert(f.unary()?),
        19 => GlobalAvgPooling2d(f.unary()?),
        20 => {
            let num_dims = f.u32(0, "num_dims")?;
            let new_shape = f.u32s(1, "new_shape")?;
            f.check_num_dims(num_dims, "new_shape", new_shape.len())?;
            StaticReshape(self::StaticReshape {
                new_shape,
                input_id: f.u32(2, "input_id")?,
                output_id: f.u32(3, "output_id")?,
                flags: f.u32(4, "flags")?,
            })
        }
        21 => ArgMaxPooling2d(self::ArgMaxPooling2d {
            padding_top: f.u32(0, "padding_top")?,
            padding_right: f.u32(1, "padding_right")?,
            padding_bottom: f.u32(2, "padding_bottom")?,
            padding_left: f.u32(3, "padding_left")?,
            pooling_height: f.u32(4, "pooling_height")?,
            pooling_width: f.u32(5, "pooling_width")?,
            input_id: f.u32(6, "input_id")?,
            output_value_id: f.u32(7, "output_value_id")?,
            output_index_id: f.u32(8, "output_index_id")?,
            flags: f.u32(9, "flags")?,
        }),
        22 => SquareRoot(f.unary()?),
        23 => Ceiling(f.unary()?),
        24 => Hardswish(f.unary()?),
        25 => LeakyRelu(self::LeakyRelu {
            negative_slope: f.f32(0, "negative_slope")?,
            input_id: f.u32(1, "input_id")?,
            output_id: f.u32(2, "output_id")?,
            flags: f.u32(3, "flags")?,
        }),
        26 => Maximum(f.binary()?),
        27 => Negate(f.unary()?),
        28 => Square(f.unary()?),
        29 => Elu(self::Elu {
            alpha: f.f32(0, "alpha")?,
            input_id: f.u32(1, "input_id")?,
            output_id: f.u32(2, "output_id")?,
            flags: f.u32(3, "flags")?,
        }),
        30 => Abs(f.unary()?),
        31 => Prelu(f.binary()?),
        32 => Concatenate2(f.concatenate(2)?),
        33 => Concatenate3(f.concatenate(3)?),
        34 => Concatenate4(f.concatenate(4)?),
        35 => {
            let num_dims = f.u32(0, "num_dims")?;
            let offsets = f.u32s(1, "offsets")?;
            let sizes = f.u32s(2, "sizes")?;
            f.check_num_dims(num_dims, "offsets", offsets.len())?;
            f.check_num_dims(num_dims, "sizes", sizes.len())?;
            StaticSlice(self::StaticSlice {
                offsets,
                sizes,
                input_id: f.u32(3, "input_id")?,
                output_id: f.u32(4, "output_id")?,
                flags: f.u32(5, "flags")?,
            })
        }
        36 => ScaledDotProductAttention(self::ScaledDotProductAttention {
            query_id: f.u32(0, "query_id")?,
            key_id: f.u32(1, "key_id")?,
            value_id: f.u32(2, "value_id")?,
            scale_id: f.u32(3, "scale_id")?,
            mask_id: f.u32(4, "mask_id")?,
            output_id: f.u32(5, "output_id")?,
            flags: f.u32(6, "flags")?,
        }),
        37 => BatchMatrixMultiply(f.binary()?),
        38 => Concatenate5(f.concatenate(5)?),
        39 => ConvTranspose2d(f.conv()?),
        40 => ReciprocalSquareRoot(f.unary()?),
        41 => Log(f.unary()?),
        42 => Gelu(f.unary()?),
        43 => Tanh(f.unary()?),
        44 => Exp(f.unary()?),
        45 => Sin(f.unary()?),
        46 => Copy(f.unary()?),
        47 => Cos(f.unary()?),
        // tag_name() accepted only 1..=47.
        _ => {
            return Err(XnnError::UnknownTag {
                what: "XNodeUnion",
                tag: tag.into(),
                at,
            })
        }
    };
    Ok(XNode {
        kind,
        debug_handle,
        output_min_max,
    })
}
