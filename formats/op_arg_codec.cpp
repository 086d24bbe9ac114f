#include "formats/op_arg_codec.h"

namespace moerr::formats {

void SetArg(const OpArg& in, schema::Arg::Builder out) {
  using K = OpArg::Kind;
  switch (in.kind) {
    case K::kNone: out.setNone(); break;
    case K::kTensor: out.setTensor(in.i); break;
    case K::kTensors: SetList(out.initTensors(in.ints.size()), in.ints); break;
    case K::kInt: out.setInt(in.i); break;
    case K::kFloat: out.setFloat(in.f); break;
    case K::kBool: out.setBool(in.i != 0); break;
    case K::kText: out.setText(TextOf(in.text)); break;
    case K::kInts: SetList(out.initInts(in.ints.size()), in.ints); break;
    case K::kFloats: SetList(out.initFloats(in.floats.size()), in.floats); break;
    case K::kBools: {
      auto list = out.initBools(in.ints.size());
      for (size_t i = 0; i < in.ints.size(); ++i) list.set(i, in.ints[i] != 0);
      break;
    }
    case K::kDevice: out.setDevice(TextOf(in.text)); break;
    case K::kUnsupported: out.setUnsupported(TextOf(in.text)); break;
    case K::kOptionalTensors: SetList(out.initOptionalTensors(in.ints.size()), in.ints); break;
    case K::kWrappedFloat: out.setWrappedFloat(in.f); break;
    case K::kWrappedInt: out.setWrappedInt(in.i); break;
    case K::kWrappedBool: out.setWrappedBool(in.i != 0); break;
  }
}

OpArg GetArg(schema::Arg::Reader in) {
  using K = OpArg::Kind;
  OpArg a;
  switch (in.which()) {
    case schema::Arg::NONE: a.kind = K::kNone; break;
    case schema::Arg::TENSOR: a.kind = K::kTensor, a.i = static_cast<int64_t>(in.getTensor()); break;
    case schema::Arg::TENSORS: a.kind = K::kTensors, a.ints = GetList<int64_t>(in.getTensors()); break;
    case schema::Arg::INT: a.kind = K::kInt, a.i = in.getInt(); break;
    case schema::Arg::FLOAT: a.kind = K::kFloat, a.f = in.getFloat(); break;
    case schema::Arg::BOOL: a.kind = K::kBool, a.i = in.getBool(); break;
    case schema::Arg::TEXT: a.kind = K::kText, a.text = std::string(View(in.getText())); break;
    case schema::Arg::INTS: a.kind = K::kInts, a.ints = GetList<int64_t>(in.getInts()); break;
    case schema::Arg::FLOATS: a.kind = K::kFloats, a.floats = GetList<double>(in.getFloats()); break;
    case schema::Arg::BOOLS: a.kind = K::kBools, a.ints = GetList<int64_t>(in.getBools()); break;
    case schema::Arg::DEVICE: a.kind = K::kDevice, a.text = std::string(View(in.getDevice())); break;
    case schema::Arg::UNSUPPORTED: a.kind = K::kUnsupported, a.text = std::string(View(in.getUnsupported())); break;
    case schema::Arg::OPTIONAL_TENSORS: a.kind = K::kOptionalTensors, a.ints = GetList<int64_t>(in.getOptionalTensors()); break;
    case schema::Arg::WRAPPED_FLOAT: a.kind = K::kWrappedFloat, a.f = in.getWrappedFloat(); break;
    case schema::Arg::WRAPPED_INT: a.kind = K::kWrappedInt, a.i = in.getWrappedInt(); break;
    case schema::Arg::WRAPPED_BOOL: a.kind = K::kWrappedBool, a.i = in.getWrappedBool(); break;
    default: a.kind = K::kUnsupported, a.text = "argument kind from a newer writer";
  }
  return a;
}

}  // namespace moerr::formats
