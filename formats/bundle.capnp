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

# The payload of a `record` frame.
struct Record {
  step @0 :Int64;  # -1: not tied to a step.
  union {
    blob @1 :Blob;          # written after the blob's chunk frames
    tensor @2 :Tensor;      # written after its blob record
    stepBegin @3 :Void;
    stepEnd @4 :Void;       # a step is complete when its stepEnd is in the file
    annotation @5 :Field;
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
}
