# moerr bundle schema, v1. Cap'n Proto describes the index and the records;
# tensor bytes never live in a Cap'n Proto message (they are chunk frames).
# Evolution: new fields only at new ordinals. A reader refuses a bundle whose
# Index.requiredFeatures has a bit it does not know.
@0xbe8fddd67e28a47b;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("moerr::formats::schema");

enum DType { f64 @0; f32 @1; bf16 @2; f16 @3; i64 @4; i32 @5; i16 @6; i8 @7; u8 @8; bool @9; }

enum Codec {
  raw @0;   # payload is the chunk's bytes as they are (shuffle must be 1)
  zstd @1;  # one zstd frame, content size and checksum set
}

enum Role {
  other @0;
  parameter @1;
  optimizerState @2;
  batch @3;
  leaf @4;        # read by the step before any recorded op produced it
  activation @5;  # an op output (full capture mode)
  gradient @6;
  rng @7;
  received @8;    # what a collective delivered to this rank (replayable and full modes)
}

struct Chunk {
  offset @0 :UInt64;      # file offset of the chunk frame's payload. Must be 8-aligned,
                          # past the superblock and a frame header, and end before the index.
  storedSize @1 :UInt64;  # payload bytes. Must equal the frame header's length.
  rawSize @2 :UInt64;     # decoded bytes. Must be > 0 and <= Limits.max_chunk_bytes.
  codec @3 :Codec;
  shuffle @4 :UInt8;      # element size the bytes were byte-shuffled by; 1 = none.
}

struct Blob {
  # XXH3-128 over the raw bytes, then the dtype byte, then the shape as int64s.
  hashLow @0 :UInt64;
  hashHigh @1 :UInt64;
  dtype @2 :DType;
  shape @3 :List(Int64);  # Must be non-negative; numel * itemsize must equal rawSize.
  rawSize @4 :UInt64;
  chunks @5 :List(Chunk); # in byte order; their rawSizes sum to rawSize.
}

struct Tensor {
  name @0 :Text;    # Must be valid UTF-8, without NUL, unique per step. Never a path.
  role @1 :Role;
  step @2 :Int64;   # -1: not tied to a step.
  blob @3 :UInt32;  # index into Index.blobs. Must be < the blob count.
}

# A JSON-like value for annotations (model config, versions, crash notes).
struct Value {
  union {
    null @0 :Void;
    boolean @1 :Bool;
    integer @2 :Int64;
    number @3 :Float64;
    text @4 :Text;
    list @5 :List(Value);
    object @6 :List(Field);
  }
}

struct Field {
  key @0 :Text;
  value @1 :Value;
}

# ---- the trace (DESIGN.md, "The trace") -------------------------------------

# Summary statistics of a tensor's values (over all elements, in fp64).
struct Fingerprint {
  numel @0 :UInt64;
  min @1 :Float64;      # NaN when numel is 0 or every value is NaN
  max @2 :Float64;
  mean @3 :Float64;     # over finite values
  absMax @4 :Float64;   # over finite values
  l2 @5 :Float64;       # over finite values
  nan @6 :UInt64;
  posInf @7 :UInt64;
  negInf @8 :UInt64;
  beyondF16 @9 :UInt64;   # finite values with |x| > 65504
  beyondBf16 @10 :UInt64; # finite values with |x| > 3.3895e38
  hash @11 :UInt64;       # XXH3-64 of the contiguous bytes
  unknown @12 :UInt32;    # fields not known exactly (formats/trace.h, Fingerprint::Field);
                          # 0 in recordings, set by imports of dumps that lack them
  checksum @13 :UInt64;     # an imported dump's own checksum of the bytes (checksumKind)
  checksumKind @14 :UInt8;  # 0 none; 1 msprobe's md5 summary (CRC-32); 2 its xor summary (64 bits)
}

enum Phase { forward @0; backward @1; optimizer @2; other @3; }

# A tensor as an op saw it, recorded when its id first appears.
struct TensorMeta {
  id @0 :UInt64;            # unique in the bundle; ids follow TensorImpl identity and version
  dtype @1 :DType;
  shape @2 :List(Int64);
  strides @3 :List(Int64);  # in elements
  storageOffset @4 :Int64;
  fingerprint @5 :Fingerprint;
  producer @6 :Int64;       # seq of the op that produced it; -1 for a leaf
  leaf @7 :Text;            # for a captured leaf: its tensor name in the bundle; else empty
  viewOf @8 :UInt64;        # non-zero: these values are a view (shape, strides, storageOffset
                            # into the same storage) of that tensor id, at the same version;
                            # autograd keeps such views of composite ops' internals
}

# A non-tensor (or tensor) argument of an op, enough to re-dispatch it.
struct Arg {
  union {
    none @0 :Void;
    tensor @1 :UInt64;          # TensorMeta.id
    tensors @2 :List(UInt64);
    int @3 :Int64;              # also dtypes, layouts and memory formats (their enum values)
    float @4 :Float64;
    bool @5 :Bool;
    text @6 :Text;
    ints @7 :List(Int64);
    floats @8 :List(Float64);
    bools @9 :List(Bool);
    device @10 :Text;
    unsupported @11 :Text;      # the argument's kind; the op cannot be re-dispatched as recorded
    optionalTensors @12 :List(Int64);  # tensor ids, -1 for None
    # A Python number passed where the schema takes a Tensor: a 0-dim CPU
    # tensor flagged as a wrapped number (f64, i64 or bool), which type
    # promotion ranks below every dimensioned or 0-dim tensor. Rebuilt so at
    # replay; a plain 0-dim f64 tensor would promote the op to f64.
    wrappedFloat @13 :Float64;
    wrappedInt @14 :Int64;
    wrappedBool @15 :Bool;
  }
}

struct OpEvent {
  seq @0 :UInt64;          # execution order within the bundle
  thread @1 :UInt32;
  phase @2 :Phase;
  name @3 :Text;           # "aten::mm"
  overload @4 :Text;       # "" or "out", "Tensor", ...
  sequenceNr @5 :Int64;    # autograd sequence number; -1 when none
  forwardSeq @6 :Int64;    # for a backward op: seq of the forward op that made its node; else -1
  module @7 :Text;         # "model.layers.3.mlp.experts.5" (for backward ops: the forward op's)
  args @8 :List(Arg);
  outputs @9 :List(UInt64);  # TensorMeta ids; 0 for a non-tensor output
  autocast @10 :Int8 = -1;   # CPU autocast dtype in force (a DType), or -1 when off
  device @11 :Text;          # device type of its first tensor argument ("cpu", "cuda", ...);
                             # empty when it has none, and in files before this field
  scope @12 :Bool;           # a module boundary an importer wrote (msprobe's Module.* entries):
                             # its values are its inner ops'; it computes nothing itself
}

struct OpBatch {
  ops @0 :List(OpEvent);
  tensors @1 :List(TensorMeta);  # every id first seen in these ops
}

# One router decision (per MoE layer and micro-batch). Tensors are in the
# bundle under the given names.
struct Routing {
  layer @0 :Int64;
  microBatch @1 :Int64;
  topkIds @2 :Text;
  topkWeights @3 :Text;
  logits @4 :Text;              # empty when not captured
  tokenCounts @5 :List(Int64);  # per expert
}

# The payload of a `record` frame.
struct Record {
  step @0 :Int64;  # -1: not tied to a step.
  union {
    blob @1 :Blob;          # written after the blob's chunk frames
    tensor @2 :Tensor;      # written after its blob record
    stepBegin @3 :Void;
    stepEnd @4 :Void;       # a step is complete when its stepEnd is in the file
    annotation @5 :Field;
    ops @6 :OpBatch;
    routing @7 :Routing;
  }
}

struct RecordRef {
  kind @0 :UInt16;    # Record's union discriminant
  step @1 :Int64;
  offset @2 :UInt64;  # payload offset of the record frame
  length @3 :UInt64;  # payload bytes
}

# The payload of an `index` frame, and of each `checkpoint` frame (which
# describes the file up to its own offset).
struct Index {
  requiredFeatures @0 :UInt64;
  blobs @1 :List(Blob);
  tensors @2 :List(Tensor);
  records @3 :List(RecordRef);  # every record but blob and tensor records
  writer @4 :Text;              # the moerr version that wrote the file ("0.1.0");
                                # empty in files from before moerr 0.1.0. At most
                                # Limits.max_name_bytes, valid UTF-8, no NUL.
}
