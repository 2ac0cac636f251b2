#include "tandem/accelerate/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <new>
#include <set>
#include <tuple>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/durable_io.h"
#include "tandem/error.h"

// The format is little-endian on disk; tensors are copied byte for byte.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace tandem::accelerate {
namespace {

using nlohmann::json;

struct Dtype {
  const char* name;
  at::ScalarType type;
  size_t size;
  // The position in the `safetensors` crate's `Dtype` enum, which is ordered by alignment: the
  // package lays tensors out by descending rank, then by name (`prepare` in tensor.rs).
  int rank;
};

constexpr Dtype kDtypes[] = {
    {"F64", at::kDouble, 8, 8}, {"F32", at::kFloat, 4, 7},    {"F16", at::kHalf, 2, 4},
    {"BF16", at::kBFloat16, 2, 5}, {"I64", at::kLong, 8, 9}, {"I32", at::kInt, 4, 6},
    {"I16", at::kShort, 2, 3},  {"I8", at::kChar, 1, 2},     {"U8", at::kByte, 1, 1},
    {"BOOL", at::kBool, 1, 0},
};
constexpr const char* kDtypeList = "F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL";
constexpr const char* kMetadataKey = "__metadata__";
// A valid header nests 3 levels (the header, a tensor, its shape) and its longest arrays are
// shapes: these bounds only decide which message a malformed header gets, and keep a small
// malformed file from costing much memory.
constexpr size_t kMaxNesting = 8;
constexpr size_t kMaxDimensions = kSafetensorsMaxDimensions;

const Dtype* dtype_named(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const Dtype* dtype_of(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

/// A JSON string literal exactly as serde_json writes it (and nlohmann: the same escapes).
/// Throws json::type_error for invalid UTF-8.
std::string json_string(const std::string& s) { return json(s).dump(); }

/// A name quoted for a one-line message: JSON-escaped (so no newline survives), invalid UTF-8
/// replaced, and cut at 200 bytes.
std::string quoted(const std::string& s) {
  constexpr size_t kLimit = 200;
  std::string cut = s.size() > kLimit ? s.substr(0, kLimit) : s;
  std::string text = json(cut).dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > kLimit ? text + "..." : text;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i == 8 && shape.size() > 9) return message(text, ", ... (", shape.size(), " dimensions)]");
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

std::string offsets_text(uint64_t begin, uint64_t end) { return message("[", begin, ", ", end, "]"); }

// ---------------------------------------------------------------------------------------------
// Writing

struct Entry {
  std::string name;
  const Dtype* dtype;
  at::Tensor tensor;
  uint64_t bytes;
};

std::string build_header(const std::vector<Entry>& entries,
                         const std::map<std::string, std::string>& metadata,
                         const std::string& where) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    // serde_json writes the metadata map with its keys sorted, as std::map holds them.
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      try {
        header += (first ? "" : ",") + json_string(key) + ":" + json_string(value);
      } catch (const json::type_error&) {
        throw Error(message(where, ": metadata ", quoted(key), " is not valid UTF-8"));
      }
      first = false;
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& e : entries) {
    header += first ? "" : ",";
    first = false;
    header += json_string(e.name);  // validated as UTF-8 by the caller
    header += message(":{\"dtype\":\"", e.dtype->name, "\",\"shape\":[");
    for (int64_t d = 0; d < e.tensor.dim(); ++d) header += message(d ? "," : "", e.tensor.size(d));
    header += message("],\"data_offsets\":[", offset, ",", offset + e.bytes, "]}");
    offset += e.bytes;
  }
  header += "}";
  // The package pads the header with spaces so that the data starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// ---------------------------------------------------------------------------------------------
// Reading

struct Parsed {
  std::string name;
  const Dtype* dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

/// Parses the header. Beyond JSON's grammar it refuses, as soon as the parser meets them, what no
/// safetensors header holds and what could make a small file cost much memory: a key twice in
/// one object (JSON allows it, and a DOM would silently keep one), nesting deeper than
/// kMaxNesting, an array longer than kMaxDimensions.
json parse_header(const std::string& header, const std::string& where) {
  struct Container {
    bool array = false;
    size_t entries = 0;
    std::set<std::string> keys;  // an object's keys so far
    std::string key;             // an object's latest key
  };
  std::vector<Container> stack;
  auto count_entry = [&] {
    if (stack.empty() || !stack.back().array || ++stack.back().entries <= kMaxDimensions) return;
    if (stack.size() == 3 && stack[1].key == "shape") {
      throw Error(message(where, ": tensor ", quoted(stack[0].key), ": shape has more than ", kMaxDimensions,
                          " dimensions, more than Tandem reads"));
    }
    throw Error(message(where, ": the header has an array of more than ", kMaxDimensions,
                        " entries, which no safetensors header has"));
  };
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        count_entry();
        TANDEM_CHECK(stack.size() < kMaxNesting, where, ": the header nests more than ", kMaxNesting,
                     " levels deep, which no safetensors header does");
        stack.push_back({});
        stack.back().array = event == json::parse_event_t::array_start;
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::value:
        count_entry();
        break;
      case json::parse_event_t::key: {
        if (stack.empty()) break;
        const auto& key = parsed.get_ref<const std::string&>();
        Container& object = stack.back();
        object.key = key;
        if (object.keys.insert(key).second) break;
        if (stack.size() == 1) {
          throw Error(key == kMetadataKey ? message(where, ": \"__metadata__\" appears twice in the header")
                                          : message(where, ": tensor ", quoted(key), " appears twice in the header"));
        }
        if (stack.size() == 2 && stack[0].key == kMetadataKey) {
          throw Error(message(where, ": __metadata__ key ", quoted(key), " appears twice"));
        }
        if (stack.size() == 2) {
          throw Error(message(where, ": tensor ", quoted(stack[0].key), " has the field ", quoted(key), " twice"));
        }
        throw Error(message(where, ": the key ", quoted(key), " appears twice in one object of the header"));
      }
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of the input and would accept "{}\0junk";
  // JSON allows no raw NUL anywhere (inside strings it must be escaped).
  const auto nul = header.find('\0');
  TANDEM_CHECK(nul == std::string::npos, where, ": the header is not valid JSON (error at byte ", nul + 1, " of ",
               header.size(), ")");
  json root;
  try {
    root = json::parse(header.begin(), header.end(), callback);
  } catch (const json::parse_error& e) {
    throw Error(message(where, ": the header is not valid JSON (error at byte ", e.byte, " of ", header.size(), ")"));
  } catch (const json::exception&) {
    throw Error(message(where, ": the header is not valid JSON"));
  } catch (const std::bad_alloc&) {
    throw Error(message(where, ": not enough memory to read the ", header.size(), "-byte header"));
  }
  return root;
}

/// "a number", "an array", "null": what a JSON value is, for messages.
std::string kind(const json& value) {
  if (value.is_null()) return "null";
  return message(value.is_array() || value.is_object() ? "an " : "a ", value.type_name());
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& where) {
  TANDEM_CHECK(value.is_object(), where, ": \"__metadata__\" is ", kind(value), ", not an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    TANDEM_CHECK(item.is_string(), where, ": __metadata__ ", quoted(key), " is ", kind(item), ", not a string");
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

Parsed parse_tensor(const std::string& name, const json& info, uint64_t data_size, const std::string& where) {
  const std::string tensor = message(where, ": tensor ", quoted(name));
  TANDEM_CHECK(info.is_object(), tensor, " is ", kind(info), ", not an object with dtype, shape and data_offsets");
  for (const auto& [field, _] : info.items()) {
    TANDEM_CHECK(field == "dtype" || field == "shape" || field == "data_offsets", tensor, " has an unknown field ",
                 quoted(field), " (expected dtype, shape, data_offsets)");
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    TANDEM_CHECK(info.contains(field), tensor, " has no \"", field, "\"");
  }
  Parsed p;
  p.name = name;

  const json& dtype = info.at("dtype");
  TANDEM_CHECK(dtype.is_string(), tensor, ": dtype is ", kind(dtype), ", not a string such as \"F32\"");
  p.dtype = dtype_named(dtype.get<std::string>());
  TANDEM_CHECK(p.dtype, tensor, " has dtype ", quoted(dtype.get<std::string>()), ", not one of ", kDtypeList);

  const json& shape = info.at("shape");
  std::vector<uint64_t> dims;
  bool valid = shape.is_array();
  if (valid) {
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) { valid = false; break; }
      dims.push_back(d.get<uint64_t>());
    }
  }
  TANDEM_CHECK(valid, tensor, ": shape is not a list of non-negative integers");
  // The element count as the package computes it: a running product that must not overflow.
  // LibTorch also needs the contiguous strides (products of max(d, 1)) to fit in an int64.
  uint64_t elements = 1;
  uint64_t stride = 1;
  for (uint64_t d : dims) {
    TANDEM_CHECK(!__builtin_mul_overflow(elements, d, &elements), tensor, ": shape ", shape_text(dims),
                 " has more elements than 64 bits count");
    TANDEM_CHECK(!__builtin_mul_overflow(stride, std::max<uint64_t>(d, 1), &stride) &&
                     stride <= static_cast<uint64_t>(INT64_MAX),
                 tensor, ": shape ", shape_text(dims), " is too large for a LibTorch tensor (its strides overflow int64)");
  }
  uint64_t needed = 0;
  TANDEM_CHECK(!__builtin_mul_overflow(elements, p.dtype->size, &needed), tensor, ": shape ", shape_text(dims),
               " of ", p.dtype->name, " has more bytes than 64 bits count");
  for (uint64_t d : dims) p.shape.push_back(static_cast<int64_t>(d));

  const json& offsets = info.at("data_offsets");
  TANDEM_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                   offsets[1].is_number_unsigned(),
               tensor, ": data_offsets is not a pair [begin, end] of non-negative integers");
  p.begin = offsets[0].get<uint64_t>();
  p.end = offsets[1].get<uint64_t>();
  TANDEM_CHECK(p.begin <= p.end, tensor, ": data_offsets ", offsets_text(p.begin, p.end), " end before they begin");
  TANDEM_CHECK(p.end - p.begin == needed, tensor, ": shape ", shape_text(dims), " of ", p.dtype->name, " needs ",
               needed, " bytes but data_offsets ", offsets_text(p.begin, p.end), " span ", p.end - p.begin);
  TANDEM_CHECK(p.end <= data_size, tensor, ": data_offsets ", offsets_text(p.begin, p.end), " go past the ",
               data_size, " bytes of data after the header");
  return p;
}

/// The tensors must tile the data exactly: sorted by offsets, each begins where the previous
/// ended, and the last ends at the end of the file (the package's `validate`).
void check_layout(std::vector<Parsed>& tensors, uint64_t data_size, const std::string& where) {
  std::sort(tensors.begin(), tensors.end(), [](const Parsed& a, const Parsed& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t position = 0;
  const Parsed* previous = nullptr;
  for (const auto& t : tensors) {
    if (t.begin < position) {
      throw Error(message(where, ": tensors ", quoted(previous->name), " and ", quoted(t.name),
                          " overlap: data_offsets ", offsets_text(previous->begin, previous->end), " and ",
                          offsets_text(t.begin, t.end)));
    }
    if (t.begin > position) {
      throw Error(message(where, ": bytes ", position, " to ", t.begin, " of the data belong to no tensor (",
                          previous ? message("a gap between tensors ", quoted(previous->name), " and ")
                                   : std::string("before tensor "),
                          quoted(t.name), ")"));
    }
    position = t.end;
    previous = &t;
  }
  if (position < data_size) {
    throw Error(message(where, ": bytes ", position, " to ", data_size, " of the data belong to no tensor (",
                        previous ? "unused bytes after tensor " + quoted(previous->name)
                                 : std::string("the header lists no tensor"),
                        ")"));
  }
}

}  // namespace

namespace {

// Checks `tensors` as save_safetensors documents and orders them as the package lays them out.
std::vector<Entry> entries_of(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& where) {
  std::vector<Entry> entries;
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, tensor] = tensors[i];
    const std::string label = message(where, ": tensor ", quoted(name));
    try {
      json_string(name);
    } catch (const json::type_error&) {
      throw Error(message(where, ": the name of tensor ", i, " is not valid UTF-8"));
    }
    TANDEM_CHECK(name != kMetadataKey, where, ": a tensor cannot be named \"__metadata__\" (the header's metadata key)");
    TANDEM_CHECK(names.insert(name).second, where, ": two tensors are named ", quoted(name));
    TANDEM_CHECK(tensor.defined(), label, " is undefined");
    TANDEM_CHECK(tensor.layout() == at::kStrided, label, " has layout ", tensor.layout(),
                 ": safetensors holds dense tensors (call to_dense())");
    TANDEM_CHECK(!tensor.is_meta(), label, " is on the meta device and has no data");
    TANDEM_CHECK(static_cast<size_t>(tensor.dim()) <= kMaxDimensions, label, " has ", tensor.dim(),
                 " dimensions; safetensors files here hold at most ", kMaxDimensions);
    const Dtype* dtype = dtype_of(tensor.scalar_type());
    TANDEM_CHECK(dtype, label, " has dtype ", tensor.scalar_type(), "; safetensors files hold ", kDtypeList);
    entries.push_back({name, dtype, tensor, static_cast<uint64_t>(tensor.numel()) * dtype->size});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.dtype->rank != b.dtype->rank) return a.dtype->rank > b.dtype->rank;
    return a.name < b.name;  // byte order, as Rust compares strings
  });
  return entries;
}

// The file's bytes in order, handed to `write` piece by piece.
void emit(const std::vector<Entry>& entries, const std::string& header,
          const std::function<void(const void*, size_t)>& write) {
  unsigned char length[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  write(length, sizeof length);
  write(header.data(), header.size());
  for (const auto& e : entries) {
    if (e.bytes == 0) continue;
    // One tensor at a time on the CPU: a GPU model is never copied whole.
    at::Tensor cpu = e.tensor.detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
    write(cpu.data_ptr(), e.bytes);
  }
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "save_safetensors " + path;
  const auto entries = entries_of(tensors, where);
  const std::string header = build_header(entries, metadata, where);
  detail::write_file_durably(
      path,
      [&](int fd) {
        const std::string context = where + ": cannot write";
        emit(entries, header, [&](const void* data, size_t size) { detail::write_all(fd, data, size, context); });
      },
      where);
}

std::string safetensors_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string where = "safetensors_bytes";
  const auto entries = entries_of(tensors, where);
  const std::string header = build_header(entries, metadata, where);
  std::string out;
  emit(entries, header, [&](const void* data, size_t size) { out.append(static_cast<const char*>(data), size); });
  return out;
}

namespace {

int open_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, "safetensors ", path, ": cannot open: ", detail::errno_text(errno));
  return fd;
}

/// `path`'s checked header, read from `fd`.
SafetensorsIndex index_of(int fd, const std::string& path) {
  const std::string where = "safetensors " + path;
  SafetensorsIndex out;
  struct stat st {};
  TANDEM_CHECK(::fstat(fd, &st) == 0, where, ": cannot stat: ", detail::errno_text(errno));
  TANDEM_CHECK(S_ISREG(st.st_mode), where, ": not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  const std::string read_context = where + ": cannot read";
  const std::string changed = where + ": the file became shorter while it was read";

  TANDEM_CHECK(file_size >= 8, where, ": the file has ", file_size,
               " bytes, too few for the 8-byte header length: not a safetensors file");
  unsigned char length[8];
  TANDEM_CHECK(detail::pread_all(fd, length, 8, 0, read_context), changed);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  TANDEM_CHECK(n <= kSafetensorsMaxHeaderBytes, where, ": the header length is ", n, ", more than the ",
               kSafetensorsMaxHeaderBytes, " bytes allowed: not a safetensors file");
  TANDEM_CHECK(n <= file_size - 8, where, ": the header length is ", n, " but only ", file_size - 8,
               " bytes follow it: the file is truncated");
  std::string header(n, '\0');
  TANDEM_CHECK(detail::pread_all(fd, header.data(), n, 8, read_context), changed);
  const uint64_t data_size = file_size - 8 - n;

  TANDEM_CHECK(n > 0 && header[0] == '{', where, ": the header does not begin with '{': not a safetensors file");
  json root = parse_header(header, where);
  TANDEM_CHECK(root.is_object(), where, ": the header is not a JSON object");

  out.path = path;
  std::vector<Parsed> parsed;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      out.metadata = parse_metadata(value, where);
    } else {
      parsed.push_back(parse_tensor(key, value, data_size, where));
    }
  }
  root = json();  // the header's DOM is no longer needed: free it before the data is read
  check_layout(parsed, data_size, where);
  for (auto& p : parsed) {
    out.tensors.push_back({std::move(p.name), p.dtype->type, std::move(p.shape), 8 + n + p.begin});
  }
  return out;
}

/// Rows [first, first + count) of `entry`, read from `fd` into a new tensor.
at::Tensor read_rows(int fd, const SafetensorsIndex& index, const SafetensorsIndex::Entry& entry, int64_t first,
                     int64_t count) {
  const std::string where = "safetensors " + index.path;
  const int64_t rows = entry.shape.empty() ? 1 : entry.shape[0];
  TANDEM_CHECK(first >= 0 && count >= 0 && first <= rows && count <= rows - first, where, ": tensor ",
               quoted(entry.name), " has ", rows, " rows; rows ", first, " to ", first + count, " were asked for");
  std::vector<int64_t> shape = entry.shape;
  if (shape.empty()) {
    if (count == 1) shape = {};  // the whole 0-d tensor
    else shape = {count};
  } else {
    shape[0] = count;
  }
  at::Tensor t;
  try {
    t = at::empty(shape, at::TensorOptions().dtype(entry.dtype));
  } catch (const std::exception& e) {  // out of memory
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;  // fits: parse_tensor checked the whole tensor's size
    throw Error(message(where, ": cannot allocate tensor ", quoted(entry.name), " (",
                        elements * static_cast<int64_t>(c10::elementSize(entry.dtype)), " bytes): ", one_line(e)));
  }
  const uint64_t bytes = static_cast<uint64_t>(t.nbytes());
  const uint64_t row_bytes = count > 0 ? bytes / static_cast<uint64_t>(count) : 0;
  if (bytes > 0) {
    TANDEM_CHECK(detail::pread_all(fd, t.data_ptr(), bytes, entry.offset + static_cast<uint64_t>(first) * row_bytes,
                                   where + ": cannot read"),
                 where, ": the file became shorter while it was read");
  }
  if (entry.dtype == at::kBool) {
    // A bool byte other than 0 or 1 is undefined behaviour in C++ (and in LibTorch's kernels).
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    for (uint64_t i = 0; i < bytes; ++i) {
      TANDEM_CHECK(b[i] <= 1, where, ": tensor ", quoted(entry.name), ": BOOL element ",
                   i + static_cast<uint64_t>(first) * row_bytes, " is the byte ", static_cast<int>(b[i]),
                   ", not 0 or 1");
    }
  }
  return t;
}

int64_t rows_of(const SafetensorsIndex::Entry& entry) { return entry.shape.empty() ? 1 : entry.shape[0]; }

}  // namespace

SafetensorsIndex index_safetensors(const std::string& path) {
  detail::UniqueFd fd(open_file(path));
  return index_of(fd.get(), path);
}

SafetensorsFile load_safetensors(const std::string& path) {
  detail::UniqueFd fd(open_file(path));
  SafetensorsIndex index = index_of(fd.get(), path);
  SafetensorsFile file;
  file.metadata = std::move(index.metadata);
  for (const auto& entry : index.tensors) {
    file.tensors.emplace_back(entry.name, read_rows(fd.get(), index, entry, 0, rows_of(entry)));
  }
  return file;
}

at::Tensor read_safetensors_rows(const SafetensorsIndex& index, const SafetensorsIndex::Entry& entry, int64_t first,
                                 int64_t count) {
  detail::UniqueFd fd(open_file(index.path));
  return read_rows(fd.get(), index, entry, first, count);
}

}  // namespace tandem::accelerate
