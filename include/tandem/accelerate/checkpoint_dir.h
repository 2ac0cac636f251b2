#pragma once
// A crash-safe checkpoint folder (docs/checkpoints.md): files are written into a temporary
// folder next to the final one, and commit() adds `manifest.json` (every file's size and CRC-32),
// flushes everything and renames the folder into place. A crash at any moment leaves either no
// checkpoint of that name or a complete one, never a half-written one; the reader verifies every
// file against the manifest before anything is loaded.
//
// Names: `checkpoint_<step>` (checkpoint_name(120) is "checkpoint_000120"); list_checkpoints()
// orders by that step, keep_newest() applies a `total_limit`.
//
// Example:
//   tandem::accelerate::CheckpointWriter writer("checkpoints", tandem::accelerate::checkpoint_name(step));
//   tandem::accelerate::save_safetensors(writer.path_for("model.safetensors"), weights);
//   writer.add_file("state.json", state_json);
//   writer.commit();                                   // checkpoints/checkpoint_000120 now exists
//   tandem::accelerate::keep_newest("checkpoints", 3);
//
//   tandem::accelerate::CheckpointReader reader(tandem::accelerate::list_checkpoints("checkpoints").back());
//   auto weights = tandem::accelerate::load_safetensors(reader.path("model.safetensors"));
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::accelerate {

/// The manifest every committed checkpoint holds, and the version of its format.
constexpr const char* kCheckpointManifest = "manifest.json";
constexpr int kCheckpointFormatVersion = 1;
/// Folder names list_checkpoints() recognizes: this prefix, then the step in decimal digits.
constexpr const char* kCheckpointPrefix = "checkpoint_";

/// "checkpoint_000120": the folder name for the checkpoint at `step` (zero-padded to six digits
/// so that `ls` lists them in order; longer steps simply have more digits). Throws when step < 0.
std::string checkpoint_name(int64_t step);

/// Writes one checkpoint: files go into `root/.tmp-<name>-<pid>/` until commit() renames it to
/// `root/<name>`. Destroyed without a successful commit, it removes its temporary folder.
/// One writer per checkpoint: the process that writes it (other ranks send it their state).
class CheckpointWriter {
 public:
  /// Creates `root` if needed and the temporary folder. `name` is one folder name (no '/', not
  /// starting with '.'). A stale temporary folder of the same name and pid (a crashed earlier
  /// process whose pid was reused) is removed first.
  CheckpointWriter(std::string root, std::string name);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Writes `bytes` as `relative_name` ("state.json", "rank_1/rng.bin"): '/'-separated names,
  /// no "." or ".." part, not "manifest.json". Parent folders are created.
  void add_file(const std::string& relative_name, std::string_view bytes);
  /// The path where the caller writes `relative_name` itself (e.g. with save_safetensors);
  /// parent folders are created, and commit() fails if the file was never written.
  std::string path_for(const std::string& relative_name);

  /// Writes the manifest (every regular file in the folder: size and CRC-32), fsyncs the files
  /// and folders, renames the folder to `root/<name>` and fsyncs `root`. If `root/<name>` is
  /// already a committed checkpoint (it has a manifest), it is replaced: atomically where the
  /// file system supports renameat2(RENAME_EXCHANGE), else by renaming the old one aside first.
  /// Anything else by that name is left alone and commit() throws. Returns `root/<name>`.
  std::string commit();

  const std::string& temporary_dir() const { return temporary_dir_; }
  const std::string& final_dir() const { return final_dir_; }
  bool committed() const { return committed_; }

 private:
  std::string root_;
  std::string name_;
  std::string temporary_dir_;
  std::string final_dir_;
  std::vector<std::string> expected_;  // names promised through path_for / add_file
  bool committed_ = false;
};

/// One file of a checkpoint, as its manifest lists it.
struct CheckpointFile {
  std::string name;  // relative to the checkpoint folder, '/'-separated
  uint64_t size = 0;
  uint32_t crc32 = 0;  // zlib's CRC-32 (the one Python's zlib.crc32 computes)
};

/// Opens a committed checkpoint and verifies it: the manifest parses, and every file it lists is
/// present with the listed size and CRC-32. Any difference throws tandem::Error, one line, e.g.
/// "checkpoint ckpt/checkpoint_000120: model.safetensors has CRC-32 0x1a2b3c4d but the manifest
/// says 0x5e6f7a8b: the file is damaged". Files in the folder that the manifest does not list are
/// ignored.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir);

  const std::string& dir() const { return dir_; }
  /// Every file of the manifest, ordered by name.
  const std::vector<CheckpointFile>& files() const { return files_; }
  /// When the checkpoint was written: UTC, ISO 8601 ("2025-01-31T12:00:00Z").
  const std::string& created() const { return created_; }
  bool contains(const std::string& relative_name) const;
  /// The path of a listed file; throws for a name the manifest does not list.
  std::string path(const std::string& relative_name) const;
  /// A listed file's bytes, verified again against the manifest's size and CRC-32.
  std::string read(const std::string& relative_name) const;

 private:
  const CheckpointFile& find(const std::string& relative_name) const;
  std::string dir_;
  std::string created_;
  std::vector<CheckpointFile> files_;
};

/// The committed checkpoints under `root`, oldest first: folders named `checkpoint_<digits>`
/// that hold a manifest, ordered by the step's numeric value (ties by name). Temporary folders of
/// writers (".tmp-…") and anything else are never listed. Empty when `root` does not exist.
std::vector<std::string> list_checkpoints(const std::string& root);

/// Deletes all but the newest `keep` checkpoints of list_checkpoints(root) (accelerate's
/// `total_limit`). Each one is first renamed to a hidden name, so a crash mid-deletion never
/// leaves a partial folder that looks like a checkpoint. `keep` must be at least 1.
void keep_newest(const std::string& root, size_t keep);

}  // namespace tandem::accelerate
