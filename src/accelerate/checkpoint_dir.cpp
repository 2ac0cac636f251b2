#include "tandem/accelerate/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/durable_io.h"
#include "tandem/error.h"

namespace tandem::accelerate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

constexpr const char* kFormat = "tandem-checkpoint";
constexpr uint64_t kMaxManifestBytes = 64ull << 20;

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

/// A name inside a checkpoint: '/'-separated parts, none empty, "." or "..", no NUL byte.
bool valid_relative_name(const std::string& name) {
  if (name.empty() || name.find('\0') != std::string::npos) return false;
  size_t start = 0;
  for (;;) {
    size_t slash = name.find('/', start);
    std::string part = name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

struct Sum {
  uint64_t size = 0;
  uint32_t crc = 0;
};

/// The size and CRC-32 of a file, read in 1 MiB pieces; fsync'ed too when `flush`.
Sum checksum(const std::string& path, bool flush, const std::string& where, const std::string& name) {
  detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  TANDEM_CHECK(fd.get() >= 0, where, ": cannot open ", name, ": ", detail::errno_text(errno));
  std::vector<unsigned char> buffer(1 << 20);
  Sum sum;
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (;;) {
    ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n >= 0, where, ": cannot read ", name, ": ", detail::errno_text(errno));
    if (n == 0) break;
    crc = crc32_z(crc, buffer.data(), static_cast<size_t>(n));
    sum.size += static_cast<uint64_t>(n);
  }
  sum.crc = static_cast<uint32_t>(crc);
  if (flush) detail::fsync_fd(fd.get(), where, name);
  return sum;
}

/// Every regular file under `dir` (relative names, sorted) and every folder (absolute paths).
void walk(const std::string& dir, const std::string& prefix, std::vector<std::string>& files,
          std::vector<std::string>& dirs, const std::string& where) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string relative = prefix.empty() ? name : prefix + "/" + name;
    const auto status = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(status)) {
      dirs.push_back(it->path().string());
      walk(it->path().string(), relative, files, dirs, where);
    } else if (fs::is_regular_file(status)) {
      files.push_back(relative);
    } else {
      throw Error(message(where, ": ", relative, " is a symbolic link or a special file: a checkpoint holds regular files only"));
    }
  }
  TANDEM_CHECK(!ec, where, ": cannot list ", dir, ": ", ec.message());
}

bool is_committed_checkpoint(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  return ::lstat(join(dir, kCheckpointManifest).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void rename_or_throw(const std::string& from, const std::string& to, const std::string& where) {
  TANDEM_CHECK(::rename(from.c_str(), to.c_str()) == 0, where, ": cannot rename ", from, " to ", to, ": ",
               detail::errno_text(errno));
}

bool unsupported(int err) { return err == EINVAL || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP; }

/// Moves the finished temporary folder to its final name (Note [Committing a checkpoint]).
void move_into_place(const std::string& temporary, const std::string& final_dir, const std::string& root,
                     const std::string& name, const std::string& where) {
  // Note [Committing a checkpoint]
  // A new name: renameat2(RENAME_NOREPLACE), so that a folder created meanwhile is never
  // silently replaced (plain rename(2) replaces an empty folder). An existing checkpoint:
  // RENAME_EXCHANGE swaps the two folders in one atomic step, so `final_dir` is at every instant
  // a complete checkpoint, the old or the new one; the old one, now under the temporary name, is
  // then deleted. File systems without renameat2 flags (some network file systems) get two
  // renames: the old checkpoint aside to a hidden name, the new one into place; a crash between
  // them leaves the old checkpoint intact under `.old-<name>-<pid>` and no `final_dir`.
  struct stat st {};
  if (::lstat(final_dir.c_str(), &st) != 0) {
    TANDEM_CHECK(errno == ENOENT, where, ": cannot inspect ", final_dir, ": ", detail::errno_text(errno));
    if (::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) == 0) return;
    TANDEM_CHECK(unsupported(errno), where, ": cannot rename ", temporary, " to ", final_dir, ": ",
                 detail::errno_text(errno));
    rename_or_throw(temporary, final_dir, where);
    return;
  }
  TANDEM_CHECK(is_committed_checkpoint(final_dir), where, ": ", final_dir,
               " exists and is not a checkpoint (it has no manifest.json): it was left alone; remove it or choose another name");
  if (::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    detail::fsync_directory(root, where);
    std::error_code ec;
    fs::remove_all(temporary, ec);  // the old checkpoint; a leftover hidden folder is harmless
    return;
  }
  TANDEM_CHECK(unsupported(errno), where, ": cannot exchange ", temporary, " and ", final_dir, ": ",
               detail::errno_text(errno));
  const std::string old = join(root, message(".old-", name, "-", ::getpid()));
  std::error_code ec;
  fs::remove_all(old, ec);
  rename_or_throw(final_dir, old, where);
  if (::rename(temporary.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    ::rename(old.c_str(), final_dir.c_str());  // put the old checkpoint back
    throw Error(message(where, ": cannot rename ", temporary, " to ", final_dir, ": ", detail::errno_text(err)));
  }
  detail::fsync_directory(root, where);
  fs::remove_all(old, ec);
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  TANDEM_CHECK(step >= 0, "checkpoint_name: step ", step, " is negative: steps count from 0");
  char digits[32];
  std::snprintf(digits, sizeof digits, "%06lld", static_cast<long long>(step));
  return std::string(kCheckpointPrefix) + digits;
}

// ---------------------------------------------------------------------------------------------
// CheckpointWriter

CheckpointWriter::CheckpointWriter(std::string root, std::string name) : root_(std::move(root)), name_(std::move(name)) {
  final_dir_ = join(root_, name_);
  const std::string where = "checkpoint " + final_dir_;
  TANDEM_CHECK(!root_.empty(), "checkpoint ", name_, ": the root folder is empty: pass a folder such as \"checkpoints\"");
  TANDEM_CHECK(!name_.empty() && name_.find('/') == std::string::npos && name_[0] != '.' &&
                   name_.find('\0') == std::string::npos,
               where, ": the name \"", name_, "\" must be one folder name, not starting with '.'");
  std::error_code ec;
  fs::create_directories(root_, ec);
  TANDEM_CHECK(!ec, where, ": cannot create the folder ", root_, ": ", ec.message());
  temporary_dir_ = join(root_, message(".tmp-", name_, "-", ::getpid()));
  fs::remove_all(temporary_dir_, ec);
  TANDEM_CHECK(!ec, where, ": cannot remove the stale temporary folder ", temporary_dir_, ": ", ec.message());
  TANDEM_CHECK(::mkdir(temporary_dir_.c_str(), 0777) == 0, where, ": cannot create ", temporary_dir_, ": ",
               detail::errno_text(errno));
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(temporary_dir_, ec);
}

std::string CheckpointWriter::path_for(const std::string& relative_name) {
  const std::string where = "checkpoint " + final_dir_;
  TANDEM_CHECK(!committed_, where, ": already committed: files can no longer be added");
  TANDEM_CHECK(valid_relative_name(relative_name), where, ": \"", relative_name,
               "\" is not a file name inside the checkpoint ('/'-separated parts, none empty, \".\" or \"..\")");
  TANDEM_CHECK(relative_name != kCheckpointManifest, where, ": manifest.json is written by commit(), not by the caller");
  const std::string path = join(temporary_dir_, relative_name);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  TANDEM_CHECK(!ec, where, ": cannot create the folder of ", relative_name, ": ", ec.message());
  if (std::find(expected_.begin(), expected_.end(), relative_name) == expected_.end()) expected_.push_back(relative_name);
  return path;
}

void CheckpointWriter::add_file(const std::string& relative_name, std::string_view bytes) {
  const std::string path = path_for(relative_name);
  const std::string where = "checkpoint " + final_dir_;
  detail::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  TANDEM_CHECK(fd.get() >= 0, where, ": cannot create ", relative_name, ": ", detail::errno_text(errno));
  detail::write_all(fd.get(), bytes.data(), bytes.size(), message(where, ": cannot write ", relative_name));
  fd.close_checked(message(where, ": cannot close ", relative_name));  // flushed at commit
}

std::string CheckpointWriter::commit() {
  const std::string where = "checkpoint " + final_dir_;
  TANDEM_CHECK(!committed_, where, ": already committed");
  for (const auto& name : expected_) {
    struct stat st {};
    TANDEM_CHECK(::lstat(join(temporary_dir_, name).c_str(), &st) == 0 && S_ISREG(st.st_mode), where, ": ", name,
                 " was never written (path_for() promised it)");
  }
  std::vector<std::string> files, dirs;
  walk(temporary_dir_, "", files, dirs, where);
  std::sort(files.begin(), files.end());
  TANDEM_CHECK(!std::binary_search(files.begin(), files.end(), std::string(kCheckpointManifest)), where,
               ": manifest.json is written by commit(), not by the caller");

  ordered_json manifest;
  manifest["format"] = kFormat;
  manifest["version"] = kCheckpointFormatVersion;
  manifest["created"] = utc_now();
  manifest["files"] = ordered_json::object();
  for (const auto& name : files) {
    const Sum sum = checksum(join(temporary_dir_, name), /*flush=*/true, where, name);
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", sum.crc);
    manifest["files"][name] = ordered_json{{"size", sum.size}, {"crc32", crc}};
  }
  std::string text;
  try {
    text = manifest.dump(2) + "\n";
  } catch (const json::type_error&) {
    throw Error(message(where, ": a file name in the checkpoint is not valid UTF-8"));
  }
  {
    const std::string path = join(temporary_dir_, kCheckpointManifest);
    detail::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    TANDEM_CHECK(fd.get() >= 0, where, ": cannot create manifest.json: ", detail::errno_text(errno));
    detail::write_all(fd.get(), text.data(), text.size(), where + ": cannot write manifest.json");
    detail::fsync_fd(fd.get(), where, "manifest.json");
    fd.close_checked(where + ": cannot close manifest.json");
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) detail::fsync_directory(*it, where);
  detail::fsync_directory(temporary_dir_, where);

  move_into_place(temporary_dir_, final_dir_, root_, name_, where);
  detail::fsync_directory(root_, where);
  // `root` itself may be new (the constructor creates it): make its own entry durable too.
  fs::path absolute_root = fs::absolute(root_).lexically_normal();
  if (!absolute_root.has_filename()) absolute_root = absolute_root.parent_path();  // "a/b/" -> "a/b"
  detail::fsync_directory(absolute_root.has_parent_path() ? absolute_root.parent_path().string() : "/", where);
  committed_ = true;
  return final_dir_;
}

// ---------------------------------------------------------------------------------------------
// CheckpointReader

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string where = "checkpoint " + dir_;
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0) {
    throw Error(errno == ENOENT ? message(where, ": does not exist")
                                : message(where, ": cannot open: ", detail::errno_text(errno)));
  }
  TANDEM_CHECK(S_ISDIR(st.st_mode), where, ": not a folder");

  const std::string manifest_path = join(dir_, kCheckpointManifest);
  detail::UniqueFd fd(::open(manifest_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw Error(errno == ENOENT
                    ? message(where, ": no manifest.json: the checkpoint was never committed, or this is not a checkpoint folder")
                    : message(where, ": cannot open manifest.json: ", detail::errno_text(errno)));
  }
  TANDEM_CHECK(::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode), where, ": manifest.json is not a regular file");
  TANDEM_CHECK(static_cast<uint64_t>(st.st_size) <= kMaxManifestBytes, where, ": manifest.json has ", st.st_size,
               " bytes, more than the ", kMaxManifestBytes, " a manifest can have: the manifest is damaged");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  TANDEM_CHECK(detail::pread_all(fd.get(), text.data(), text.size(), 0, where + ": cannot read manifest.json"), where,
               ": manifest.json became shorter while it was read");

  json manifest;
  try {
    // nlohmann takes a NUL byte for the end of the input; JSON has none outside escapes.
    const auto nul = text.find('\0');
    TANDEM_CHECK(nul == std::string::npos, where, ": manifest.json is not valid JSON (error at byte ", nul + 1,
                 "): the manifest is damaged");
    manifest = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(message(where, ": manifest.json is not valid JSON (error at byte ", e.byte, "): the manifest is damaged"));
  } catch (const json::exception&) {  // out_of_range: a number beyond a double ("1e999")
    throw Error(message(where, ": manifest.json is not valid JSON (a number out of range): the manifest is damaged"));
  }
  TANDEM_CHECK(manifest.is_object() && manifest.contains("format") && manifest["format"] == kFormat, where,
               ": manifest.json is not a Tandem checkpoint manifest (it lacks \"format\": \"tandem-checkpoint\")");
  const json& version = manifest.contains("version") ? manifest["version"] : json();
  TANDEM_CHECK(version.is_number_integer(), where, ": manifest.json has no integer \"version\": the manifest is damaged");
  // An unsigned version above INT64_MAX read as int64_t would wrap to a negative one: compare as stored.
  const bool newer = version.is_number_unsigned() ? version.get<uint64_t>() > kCheckpointFormatVersion
                                                  : version.get<int64_t>() > kCheckpointFormatVersion;
  TANDEM_CHECK(!newer, where, ": manifest.json has format version ", version.dump(), ", newer than the ",
               kCheckpointFormatVersion, " this Tandem reads: upgrade Tandem");
  TANDEM_CHECK(version == kCheckpointFormatVersion, where, ": manifest.json has format version ", version.dump(),
               ", not ", kCheckpointFormatVersion);
  TANDEM_CHECK(manifest.contains("created") && manifest["created"].is_string(), where,
               ": manifest.json has no \"created\" time: the manifest is damaged");
  created_ = manifest["created"].get<std::string>();
  TANDEM_CHECK(manifest.contains("files") && manifest["files"].is_object(), where,
               ": manifest.json has no \"files\" object: the manifest is damaged");

  for (const auto& [name, entry] : manifest["files"].items()) {
    TANDEM_CHECK(valid_relative_name(name) && name != kCheckpointManifest, where, ": manifest.json lists \"", name,
                 "\", which is not a file name inside the checkpoint: the manifest is damaged");
    bool well_formed = entry.is_object() && entry.contains("size") && entry["size"].is_number_unsigned() &&
                       entry.contains("crc32") && entry["crc32"].is_string();
    CheckpointFile file;
    file.name = name;
    if (well_formed) {
      const std::string crc = entry["crc32"].get<std::string>();
      well_formed = crc.size() == 8 && crc.find_first_not_of("0123456789abcdef") == std::string::npos;
      if (well_formed) file.crc32 = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
      file.size = entry["size"].get<uint64_t>();
    }
    TANDEM_CHECK(well_formed, where, ": manifest.json's entry for ", name,
                 " is not {\"size\": bytes, \"crc32\": \"8 hex digits\"}: the manifest is damaged");
    files_.push_back(file);
  }
  std::sort(files_.begin(), files_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });

  for (const auto& file : files_) {
    const std::string path = join(dir_, file.name);
    if (::lstat(path.c_str(), &st) != 0) {
      throw Error(errno == ENOENT
                      ? message(where, ": ", file.name, " is listed in the manifest but missing: the checkpoint is incomplete")
                      : message(where, ": cannot open ", file.name, ": ", detail::errno_text(errno)));
    }
    TANDEM_CHECK(S_ISREG(st.st_mode), where, ": ", file.name, " is not a regular file");
    TANDEM_CHECK(static_cast<uint64_t>(st.st_size) == file.size, where, ": ", file.name, " has ", st.st_size,
                 " bytes but the manifest says ", file.size, ": the file is damaged");
    const Sum sum = checksum(path, /*flush=*/false, where, file.name);
    TANDEM_CHECK(sum.size == file.size, where, ": ", file.name, " has ", sum.size, " bytes but the manifest says ",
                 file.size, ": the file is damaged");
    TANDEM_CHECK(sum.crc == file.crc32, where, ": ", file.name, " has CRC-32 ", hex32(sum.crc),
                 " but the manifest says ", hex32(file.crc32), ": the file is damaged");
  }
}

const CheckpointFile& CheckpointReader::find(const std::string& relative_name) const {
  for (const auto& file : files_) {
    if (file.name == relative_name) return file;
  }
  throw Error(message("checkpoint ", dir_, ": has no file ", relative_name, " (its manifest does not list it)"));
}

bool CheckpointReader::contains(const std::string& relative_name) const {
  return std::any_of(files_.begin(), files_.end(), [&](const auto& f) { return f.name == relative_name; });
}

std::string CheckpointReader::path(const std::string& relative_name) const {
  return join(dir_, find(relative_name).name);
}

std::string CheckpointReader::read(const std::string& relative_name) const {
  const CheckpointFile& file = find(relative_name);
  const std::string where = "checkpoint " + dir_;
  const std::string path = join(dir_, file.name);
  detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  TANDEM_CHECK(fd.get() >= 0, where, ": cannot open ", file.name, ": ", detail::errno_text(errno));
  std::string bytes(static_cast<size_t>(file.size), '\0');
  const bool complete = detail::pread_all(fd.get(), bytes.data(), bytes.size(), 0, message(where, ": cannot read ", file.name));
  char extra;
  const bool longer = complete && detail::pread_all(fd.get(), &extra, 1, file.size, message(where, ": cannot read ", file.name));
  TANDEM_CHECK(complete && !longer, where, ": ", file.name, " no longer has the ", file.size,
               " bytes the manifest says: the file was changed after the checkpoint was opened");
  const uint32_t crc = static_cast<uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
  TANDEM_CHECK(crc == file.crc32, where, ": ", file.name, " has CRC-32 ", hex32(crc), " but the manifest says ",
               hex32(file.crc32), ": the file is damaged");
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// Listing and total_limit

std::vector<std::string> list_checkpoints(const std::string& root) {
  struct Found {
    std::string digits;  // the step without leading zeros ("" for 0)
    std::string name;
  };
  std::vector<Found> found;
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec == std::errc::no_such_file_or_directory) return {};
  TANDEM_CHECK(!ec, "list_checkpoints ", root, ": cannot list the folder: ", ec.message());
  const std::string prefix = kCheckpointPrefix;
  for (fs::directory_iterator end; it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!is_committed_checkpoint(join(root, name))) continue;
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
    found.push_back({digits, name});
  }
  TANDEM_CHECK(!ec, "list_checkpoints ", root, ": cannot list the folder: ", ec.message());
  // Numeric order without parsing (steps of any length): shorter digit strings are smaller.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    if (a.digits.size() != b.digits.size()) return a.digits.size() < b.digits.size();
    return std::tie(a.digits, a.name) < std::tie(b.digits, b.name);
  });
  std::vector<std::string> paths;
  for (const auto& f : found) paths.push_back(join(root, f.name));
  return paths;
}

void keep_newest(const std::string& root, size_t keep) {
  TANDEM_CHECK(keep >= 1, "keep_newest ", root, ": keeping 0 checkpoints would delete every one: keep at least 1");
  const auto all = list_checkpoints(root);
  if (all.size() <= keep) return;
  const std::string where = "keep_newest " + root;
  std::vector<std::string> doomed;
  for (size_t i = 0; i + keep < all.size(); ++i) {
    // Hidden first (one atomic rename), deleted second: a crash mid-deletion never leaves a
    // partial folder that list_checkpoints would offer for resuming.
    const std::string hidden =
        join(root, message(".deleting-", fs::path(all[i]).filename().string(), "-", ::getpid()));
    std::error_code ec;
    fs::remove_all(hidden, ec);
    rename_or_throw(all[i], hidden, where);
    doomed.push_back(hidden);
  }
  detail::fsync_directory(root, where);
  for (const auto& hidden : doomed) {
    std::error_code ec;
    fs::remove_all(hidden, ec);
    TANDEM_CHECK(!ec, where, ": cannot delete ", hidden, ": ", ec.message());
  }
}

}  // namespace tandem::accelerate
