//! `XValue`s: tensor values, their datatypes and quantization parameters, decoded from the
//! flatbuffer without yet resolving constant bytes (the graph does that once it knows
//! `constant_data`).

use super::{Result, XnnError};
use crate::fb::Table;
use crate::pte::Blob;

/// XNNPACK's `XNN_VALUE_FLAG_EXTERNAL_INPUT`.
pub const FLAG_EXTERNAL_INPUT: u32 = 1;
/// XNNPACK's `XNN_VALUE_FLAG_EXTERNAL_OUTPUT`.
pub const FLAG_EXTERNAL_OUTPUT: u32 = 2;

/// `XNN_INVALID_VALUE_ID`: "no value" wherever the schema stores a value id or external id.
pub const INVALID_ID: u32 = u32::MAX;

/// `fb_xnnpack.XNNDatatype` (a `short` in the schema). `xnn_datatype_invalid` (0) is rejected at
/// parse time: "valid Values never have this datatype".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Datatype {
    Fp32,
    Fp16,
    /// 8-bit signed, one scale and zero point per tensor.
    Qint8,
    /// 8-bit unsigned, one scale and zero point per tensor.
    Quint8,
    /// 32-bit signed, one scale per tensor.
    Qint32,
    /// 8-bit signed, one scale per channel.
    Qcint8,
    /// 32-bit signed, one scale per channel.
    Qcint32,
    /// 4-bit signed (stored +8), one scale per channel, two per byte.
    Qcint4,
    /// 8-bit signed, quantized at run time per token (row).
    Qdint8,
    /// 4-bit signed (stored +8), one bf16 scale per block of `group_size` along K, two per byte.
    Qbint4,
    /// 8-bit signed packed with per-row parameters at run time (no constant layout).
    Qpint8,
    Int32,
    /// XNNPACK-packed fp32 (no constant layout).
    Pfp32,
    Bf16,
}

impl Datatype {
    pub fn from_code(code: i16) -> Option<Self> {
        use Datatype::*;
        Some(match code {
            1 => Fp32,
            2 => Fp16,
            3 => Qint8,
            4 => Quint8,
            5 => Qint32,
            6 => Qcint8,
            7 => Qcint32,
            8 => Qcint4,
            9 => Qdint8,
            10 => Qbint4,
            11 => Qpint8,
            12 => Int32,
            13 => Pfp32,
            14 => Bf16,
            _ => return None,
        })
    }

    /// The schema's name, e.g. `xnn_datatype_qbint4`.
    pub fn name(self) -> &'static str {
        use Datatype::*;
        match self {
            Fp32 => "xnn_datatype_fp32",
            Fp16 => "xnn_datatype_fp16",
            Qint8 => "xnn_datatype_qint8",
            Quint8 => "xnn_datatype_quint8",
            Qint32 => "xnn_datatype_qint32",
            Qcint8 => "xnn_datatype_qcint8",
            Qcint32 => "xnn_datatype_qcint32",
            Qcint4 => "xnn_datatype_qcint4",
            Qdint8 => "xnn_datatype_qdint8",
            Qbint4 => "xnn_datatype_qbint4",
            Qpint8 => "xnn_datatype_qpint8",
            Int32 => "xnn_datatype_int32",
            Pfp32 => "xnn_datatype_pfp32",
            Bf16 => "xnn_datatype_bf16",
        }
    }

    /// Bits per element of a dense constant, or None for types with no constant layout.
    pub fn bits(self) -> Option<u32> {
        use Datatype::*;
        match self {
            Fp32 | Qint32 | Qcint32 | Int32 => Some(32),
            Fp16 | Bf16 => Some(16),
            Qint8 | Quint8 | Qcint8 | Qdint8 => Some(8),
            Qcint4 | Qbint4 => Some(4),
            Qpint8 | Pfp32 => None,
        }
    }

    /// Whether a value of this type needs quantization parameters.
    pub fn is_quantized(self) -> bool {
        use Datatype::*;
        matches!(
            self,
            Qint8 | Quint8 | Qint32 | Qcint8 | Qcint32 | Qcint4 | Qdint8 | Qbint4 | Qpint8
        )
    }

    /// Bytes a dense constant of shape `dims` occupies, or None on overflow or no layout.
    ///
    /// 4-bit types pack two elements per byte along the innermost dimension, and an odd innermost
    /// dimension is padded to even (`node_visitor.convert_to_qc4w`): `[N, K]` → `N * ceil(K/2)`.
    pub fn constant_bytes(self, dims: &[u32]) -> Option<u64> {
        let bits = self.bits()?;
        let numel = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))?;
        if bits == 4 {
            let last = dims.last().copied().unwrap_or(1) as u64;
            if last == 0 {
                return Some(0);
            }
            let rows = numel / last;
            rows.checked_mul(last.div_ceil(2))
        } else {
            numel.checked_mul(bits as u64 / 8)
        }
    }
}

/// `XNNTensorValue`, with its constant bytes resolved.
#[derive(Debug, Clone)]
pub struct TensorValue {
    pub datatype: Datatype,
    pub dims: Vec<u32>,
    /// Index into `XnnGraph::constant_data`; 0 means "not a constant".
    pub constant_buffer_idx: u32,
    /// Position in the delegate call's argument list, for external inputs and outputs.
    pub external_id: Option<u32>,
    /// `FLAG_EXTERNAL_INPUT` | `FLAG_EXTERNAL_OUTPUT`.
    pub flags: u32,
    /// The id nodes, `input_ids` and `output_ids` use to refer to this value.
    pub id_out: u32,
    /// The constant's bytes (exactly `datatype.constant_bytes(dims)` of them), when it is one.
    pub data: Option<Blob>,
}

impl TensorValue {
    pub fn is_external_input(&self) -> bool {
        self.flags & FLAG_EXTERNAL_INPUT != 0
    }
    pub fn is_external_output(&self) -> bool {
        self.flags & FLAG_EXTERNAL_OUTPUT != 0
    }
    pub fn numel(&self) -> u64 {
        self.dims.iter().map(|&d| d as u64).product()
    }
}

/// `PerChannelQuant`: one scale per slice along `channel_dim`.
#[derive(Debug, Clone)]
pub struct PerChannelQuant {
    /// Inline fp32 scales (older exports; empty when `scale_buffer_idx` is set).
    pub scale: Vec<f32>,
    pub channel_dim: i32,
    /// Index into `constant_data` of the fp32 scales; 0 when they are inline.
    pub scale_buffer_idx: u32,
    pub num_scales: u32,
    /// The fp32 scale bytes named by `scale_buffer_idx`.
    pub scale_data: Option<Blob>,
}

/// `PerTensorQuant`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerTensorQuant {
    pub scale: f32,
    pub zero_point: i32,
}

/// `PerTokenDynamicQuant`: the value is quantized at run time, one scale per row of the trailing
/// `num_nonbatch_dims` dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerTokenDynamicQuant {
    pub num_nonbatch_dims: i32,
}

/// `PerChannelGroupQuant`: blockwise scales `[N, K / group_size]` for a `qbint4 [N, K]` filter.
#[derive(Debug, Clone)]
pub struct PerChannelGroupQuant {
    /// Deprecated inline fp32 scales; used only when `scale_buffer_idx` is 0.
    pub scale: Vec<f32>,
    pub channel_dim: i32,
    pub group_size: i32,
    /// Deprecated inline bf16 scales (the runtime ignores them).
    pub scale_bf16: Vec<u16>,
    /// Index into `constant_data` of the bf16 scales (named `scale_<sha256>`); 0 when inline.
    pub scale_buffer_idx: u32,
    pub num_scales: u32,
    /// The bf16 scale bytes named by `scale_buffer_idx` (`2 * num_scales` bytes).
    pub scale_data: Option<Blob>,
}

impl PerChannelGroupQuant {
    /// The scales as f32, row-major `[N, K / group_size]`, from whichever source holds them.
    pub fn scales_f32(&self) -> Vec<f32> {
        match &self.scale_data {
            Some(b) => b
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            None => self.scale.clone(),
        }
    }
}

impl PerChannelQuant {
    /// The per-channel scales, from whichever source holds them.
    pub fn scales_f32(&self) -> Vec<f32> {
        match &self.scale_data {
            Some(b) => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            None => self.scale.clone(),
        }
    }
}

/// `XNNQuantParams`.
#[derive(Debug, Clone)]
pub enum QuantParams {
    PerChannel(PerChannelQuant),
    PerTensor(PerTensorQuant),
    PerTokenDynamic(PerTokenDynamicQuant),
    PerChannelGroup(PerChannelGroupQuant),
}

impl QuantParams {
    /// The schema's union member name.
    pub fn name(&self) -> &'static str {
        match self {
            QuantParams::PerChannel(_) => "PerChannelQuant",
            QuantParams::PerTensor(_) => "PerTensorQuant",
            QuantParams::PerTokenDynamic(_) => "PerTokenDynamicQuant",
            QuantParams::PerChannelGroup(_) => "PerChannelGroupQuant",
        }
    }
}

/// `XValue`: an `XNNTensorValue`, or an `XNNQuantizedTensorValue` when `quant` is set.
#[derive(Debug, Clone)]
pub struct XValue {
    pub tensor: TensorValue,
    pub quant: Option<QuantParams>,
}

impl XValue {
    pub fn id(&self) -> u32 {
        self.tensor.id_out
    }
}

/// Decodes `xvalues[index]` (constants unresolved: `data` and `scale_data` are None).
pub(super) fn decode(index: usize, t: Table<'_>) -> Result<XValue> {
    let at = || format!("xvalues[{index}]");
    let fbe = |e| XnnError::fb(at(), e);
    // XValue { xvalue_union: XValueUnion } → slots 0 (type) and 1 (value).
    let Some((tag, u)) = t.union(0).map_err(fbe)? else {
        return Err(XnnError::invalid(
            at(),
            "has no value (XValueUnion is NONE)",
        ));
    };
    match tag {
        1 => Ok(XValue {
            tensor: decode_tensor(u).map_err(|e| e.within(&at()))?,
            quant: None,
        }),
        2 => {
            // XNNQuantizedTensorValue { tensor_value, quant_params: XNNQuantParams } → slots 0, 1, 2.
            let tv = u
                .table(0)
                .map_err(fbe)?
                .ok_or_else(|| XnnError::invalid(at(), "quantized value has no tensor_value"))?;
            let tensor = decode_tensor(tv).map_err(|e| e.within(&at()))?;
            let Some((qtag, q)) = u.union(1).map_err(fbe)? else {
                return Err(XnnError::invalid(
                    at(),
                    "quantized value has no quant_params",
                ));
            };
            let quant = decode_quant(qtag, q).map_err(|e| e.within(&at()))?;
            Ok(XValue {
                tensor,
                quant: Some(quant),
            })
        }
        _ => Err(XnnError::UnknownTag {
            what: "XValueUnion",
            tag: tag.into(),
            at: at(),
        }),
    }
}

fn decode_tensor(t: Table<'_>) -> Result<TensorValue> {
    let fbe = |e| XnnError::fb("XNNTensorValue", e);
    // XNNTensorValue: datatype 0, num_dims 1, dims 2, constant_buffer_idx 3, external_id 4,
    // flags 5, id_out 6.
    let code: i16 = t.scalar(0, 0).map_err(fbe)?;
    let datatype = Datatype::from_code(code).ok_or(XnnError::UnknownTag {
        what: "XNNDatatype",
        tag: code.into(),
        at: "XNNTensorValue.datatype".into(),
    })?;
    let num_dims: u32 = t.scalar(1, 0).map_err(fbe)?;
    let dims: Vec<u32> = t.vec_of(2).map_err(fbe)?;
    if num_dims as usize != dims.len() {
        return Err(XnnError::invalid(
            "XNNTensorValue",
            format!("num_dims is {num_dims} but dims has {} entries", dims.len()),
        ));
    }
    let external_id: u32 = t.scalar(4, 0).map_err(fbe)?;
    Ok(TensorValue {
        datatype,
        dims,
        constant_buffer_idx: t.scalar(3, 0).map_err(fbe)?,
        external_id: (external_id != INVALID_ID).then_some(external_id),
        flags: t.scalar(5, 0).map_err(fbe)?,
        id_out: t.scalar(6, 0).map_err(fbe)?,
        data: None,
    })
}

fn decode_quant(tag: u8, t: Table<'_>) -> Result<QuantParams> {
    let fbe = |e| XnnError::fb("quant_params", e);
    Ok(match tag {
        // PerChannelQuant: scale 0, channel_dim 1, scale_buffer_idx 2, num_scales 3.
        1 => QuantParams::PerChannel(PerChannelQuant {
            scale: t.vec_of(0).map_err(fbe)?,
            channel_dim: t.scalar(1, 0).map_err(fbe)?,
            scale_buffer_idx: t.scalar(2, 0).map_err(fbe)?,
            num_scales: t.scalar(3, 0).map_err(fbe)?,
            scale_data: None,
        }),
        // PerTensorQuant: scale 0, zero_point 1.
        2 => QuantParams::PerTensor(PerTensorQuant {
            scale: t.scalar(0, 0.0).map_err(fbe)?,
            zero_point: t.scalar(1, 0).map_err(fbe)?,
        }),
        // PerTokenDynamicQuant: num_nonbatch_dims 0.
        3 => QuantParams::PerTokenDynamic(PerTokenDynamicQuant {
            num_nonbatch_dims: t.scalar(0, 0).map_err(fbe)?,
        }),
        // PerChannelGroupQuant: scale 0, channel_dim 1, group_size 2, scale_bf16 3 (deprecated),
        // scale_buffer_idx 4, num_scales 5.
        4 => QuantParams::PerChannelGroup(PerChannelGroupQuant {
            scale: t.vec_of(0).map_err(fbe)?,
            channel_dim: t.scalar(1, 0).map_err(fbe)?,
            group_size: t.scalar(2, 0).map_err(fbe)?,
            scale_bf16: t.vec_of(3).map_err(fbe)?,
            scale_buffer_idx: t.scalar(4, 0).map_err(fbe)?,
            num_scales: t.scalar(5, 0).map_err(fbe)?,
            scale_data: None,
        }),
        _ => {
            return Err(XnnError::UnknownTag {
                what: "XNNQuantParams",
                tag: tag.into(),
                at: "quant_params".into(),
            })
        }
    })
}
