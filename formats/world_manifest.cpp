#include "formats/world_manifest.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {
namespace {

constexpr char kFormat[] = "moerr-world";
constexpr int64_t kVersion = 1;

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

llvm::json::Value ToJson(const WorldManifest& w) {
  llvm::json::Object groups;
  for (const auto& [name, instances] : w.groups) {
    llvm::json::Array list;
    for (const std::vector<int64_t>& g : instances) list.push_back(llvm::json::Array(g));
    groups[name] = std::move(list);
  }
  llvm::json::Array ranks;
  for (const WorldRank& r : w.ranks) {
    ranks.push_back(llvm::json::Object{{"rank", r.rank}, {"bundle", r.bundle}, {"experts", llvm::json::Array(r.experts)}});
  }
  return llvm::json::Object{{"format", kFormat},         {"version", kVersion},    {"world_size", w.world_size},
                            {"ep_size", w.ep_size},      {"experts", w.experts},   {"groups", std::move(groups)},
                            {"ranks", std::move(ranks)}};
}

// What the mapper cannot say: every rank once, in order, and every group
// instance naming ranks of the world.
absl::Status CheckManifest(const WorldManifest& w, const std::string& path) {
  if (w.world_size < 1 || static_cast<int64_t>(w.ranks.size()) != w.world_size) {
    return absl::DataLossError(absl::StrFormat("%s: world_size %d but %d ranks listed", path, w.world_size,
                                               w.ranks.size()));
  }
  for (size_t i = 0; i < w.ranks.size(); ++i) {
    if (w.ranks[i].rank != static_cast<int64_t>(i) || w.ranks[i].bundle.empty() ||
        w.ranks[i].bundle.find('/') != std::string::npos) {
      return absl::DataLossError(
          absl::StrFormat("%s: ranks[%d] must be rank %d with a bundle file name in the run directory", path, i, i));
    }
  }
  for (const auto& [name, instances] : w.groups) {
    for (const std::vector<int64_t>& g : instances) {
      for (int64_t r : g) {
        if (r < 0 || r >= w.world_size) {
          return absl::DataLossError(absl::StrFormat("%s: group %s names rank %d of a world of %d", path, name, r,
                                                     w.world_size));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Found by llvm::json through argument-dependent lookup.
bool fromJSON(const llvm::json::Value& v, WorldRank& r, llvm::json::Path p) {
  llvm::json::ObjectMapper m(v, p);
  return m && m.map("rank", r.rank) && m.map("bundle", r.bundle) && m.map("experts", r.experts);
}

int64_t WorldManifest::WorldRankOf(const std::string& group, int64_t rank, int64_t group_rank) const {
  auto it = groups.find(group);
  if (it == groups.end()) return -1;
  for (const std::vector<int64_t>& g : it->second) {
    if (std::find(g.begin(), g.end(), rank) == g.end()) continue;
    return group_rank >= 0 && group_rank < static_cast<int64_t>(g.size()) ? g[group_rank] : -1;
  }
  return -1;
}

int64_t WorldManifest::GroupSizeOf(const std::string& group, int64_t rank) const {
  auto it = groups.find(group);
  if (it == groups.end()) return 0;
  for (const std::vector<int64_t>& g : it->second) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return static_cast<int64_t>(g.size());
  }
  return 0;
}

WorldManifest ExpertParallelWorld(int64_t world_size, int64_t ep_size, int64_t experts) {
  WorldManifest w;
  w.world_size = world_size;
  w.ep_size = ep_size;
  w.experts = experts;
  const int64_t replicas = world_size / ep_size, local = experts / ep_size;
  std::vector<int64_t> all;
  for (int64_t r = 0; r < world_size; ++r) all.push_back(r);
  w.groups["world"] = {all};
  for (int64_t g = 0; g < replicas; ++g) {
    std::vector<int64_t> ep;
    for (int64_t e = 0; e < ep_size; ++e) ep.push_back(g * ep_size + e);
    w.groups["expert-parallel"].push_back(ep);
  }
  for (int64_t e = 0; e < ep_size; ++e) {
    std::vector<int64_t> same;
    for (int64_t g = 0; g < replicas; ++g) same.push_back(g * ep_size + e);
    w.groups["expert-replica"].push_back(same);
  }
  for (int64_t r = 0; r < world_size; ++r) {
    WorldRank rank{r, absl::StrFormat("rank%d.moerr", r), {}};
    for (int64_t x = (r % ep_size) * local; x < (r % ep_size + 1) * local; ++x) rank.experts.push_back(x);
    w.ranks.push_back(std::move(rank));
  }
  return w;
}

absl::Status WriteWorldManifest(const std::string& run_dir, const WorldManifest& manifest) {
  const std::string path = run_dir + "/" + kWorldManifestName, tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << llvm::formatv("{0:2}", ToJson(manifest)).str() << "\n";
    out.close();
    if (!out) return absl::UnavailableError(absl::StrFormat("cannot write %s", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrFormat("cannot rename %s to %s", tmp, path));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorldManifest> ReadWorldManifest(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kWorldManifestName;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("%s: cannot read it", path));
  std::stringstream text;
  text << in.rdbuf();
  llvm::Expected<llvm::json::Value> json = llvm::json::parse(text.str());
  if (!json) return absl::DataLossError(absl::StrFormat("%s: %s", path, llvm::toString(json.takeError())));
  WorldManifest w;
  std::string format;
  int64_t version = 0;
  llvm::json::Path::Root root("world");
  llvm::json::ObjectMapper m(*json, root);
  const bool ok = m && m.map("format", format) && m.map("version", version) && m.map("world_size", w.world_size) &&
                  m.map("ep_size", w.ep_size) && m.map("experts", w.experts) && m.map("groups", w.groups) &&
                  m.map("ranks", w.ranks);
  if (!ok) {
    return absl::DataLossError(absl::StrFormat("%s: %s", path, llvm::toString(root.getError())));
  }
  if (format != kFormat || version != kVersion) {
    return absl::DataLossError(absl::StrFormat("%s: not a moerr world manifest of version %d (format \"%s\", version %d)",
                                               path, kVersion, format, version));
  }
  if (absl::Status s = CheckManifest(w, path); !s.ok()) return s;
  return w;
}

bool IsRunDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && FileExists(path + "/" + kWorldManifestName);
}

std::string RankBundlePath(const std::string& run_dir, const WorldRank& rank) {
  const std::string path = run_dir + "/" + rank.bundle;
  return !FileExists(path) && FileExists(path + kPartialSuffix) ? path + kPartialSuffix : path;
}

}  // namespace moerr::formats

namespace moerr::formats {
namespace {

// The bundles (*.moerr, finished or not) directly in `dir`, by name.
std::vector<std::string> BundlesIn(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string bundle(absl::StripSuffix(name, kPartialSuffix));
    if (absl::EndsWith(bundle, ".moerr") && entry.is_regular_file(ec) &&
        std::find(out.begin(), out.end(), bundle) == out.end()) {
      out.push_back(bundle);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<std::string> ResolveRecording(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec) || IsRunDirectory(path)) return path;
  for (const std::string& dir : {path, path + "/run"}) {
    if (dir != path && IsRunDirectory(dir)) return dir;
    const std::vector<std::string> bundles = BundlesIn(dir);
    if (bundles.size() == 1) {
      const std::string bundle = dir + "/" + bundles[0];
      return FileExists(bundle) ? bundle : bundle + kPartialSuffix;  // a writer that did not finish
    }
    if (bundles.size() > 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s holds %d bundles (%s) and no world.json: name one", dir, bundles.size(), absl::StrJoin(bundles, ", ")));
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is a directory, not a recording: a bundle is a .moerr file, a run directory holds %s (as `moerr train "
      "-o DIR` writes DIR/run)",
      path, kWorldManifestName));
}

}  // namespace moerr::formats
