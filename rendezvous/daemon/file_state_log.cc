// StateLog on files: the OS side of --state_dir.
#include "rendezvous/daemon/file_state_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "rendezvous/base/durable_file.h"

namespace ctrun::rendezvous {

namespace {

Error os_error(const std::string& what, const std::string& path) {
  return Error{ErrorCode::kInternal, what + " '" + path + "': " + std::strerror(errno)};
}

Result<std::string> read_all(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::string();
    return os_error("cannot open", path);
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Error e = os_error("cannot read", path);
      ::close(fd);
      return e;
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

class FileStateLog : public StateLog {
 public:
  FileStateLog(std::string dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}
  ~FileStateLog() override {
    if (journal_fd_ >= 0) ::close(journal_fd_);
    ::close(lock_fd_);
  }

  Result<std::vector<Json>> load() override {
    auto snapshot = read_all(path("snapshot"));
    if (!snapshot) return snapshot.error();
    DecodedRecords base = decode_state_records(snapshot.value());
    // The snapshot is replaced whole by rename: damage there is not a crash's torn tail.
    if (!base.damage.empty()) {
      return Error{ErrorCode::kInternal, "state snapshot '" + path("snapshot") +
                                             "' is damaged: " + base.damage + " at byte " +
                                             std::to_string(base.good_bytes)};
    }
    snapshot_bytes_ = snapshot.value().size();
    auto journal = read_all(path("journal"));
    if (!journal) return journal.error();
    DecodedRecords tail = decode_state_records(journal.value());
    journal_fd_ = ::open(path("journal").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (journal_fd_ < 0) return os_error("cannot open", path("journal"));
    // A record the daemon was writing when it died is dropped, and the next one goes after the
    // last whole record.
    if (tail.good_bytes != journal.value().size()) {
      dropped_ = "dropped " + std::to_string(journal.value().size() - tail.good_bytes) +
                 " bytes at the journal's end (" + tail.damage + ")";
      if (::ftruncate(journal_fd_, static_cast<off_t>(tail.good_bytes)) != 0) {
        return os_error("cannot truncate", path("journal"));
      }
    }
    if (::lseek(journal_fd_, 0, SEEK_END) < 0) return os_error("cannot seek", path("journal"));
    journal_bytes_ = tail.good_bytes;
    std::vector<Json> all = std::move(base.records);
    for (auto& r : tail.records) all.push_back(std::move(r));
    return all;
  }

  Status append(const Json& record) override {
    const std::string bytes = encode_state_record(record);
    if (auto s = write_fully(journal_fd_, bytes, path("journal")); !s) return s;
    journal_bytes_ += bytes.size();
    dirty_ = true;
    return ok_status();
  }

  Status rewrite(const std::vector<Json>& records) override {
    std::string bytes;
    for (const auto& r : records) bytes += encode_state_record(r);
    const std::string tmp = path("snapshot.tmp");
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return os_error("cannot create", tmp);
    Status s = write_fully(fd, bytes, tmp);
    if (s && ::fsync(fd) != 0) s = os_error("cannot sync", tmp);
    ::close(fd);
    if (!s) return s;
    if (::rename(tmp.c_str(), path("snapshot").c_str()) != 0) return os_error("cannot rename", tmp);
    if (auto d = sync_directory(dir_); !d) return d;
    // Only now may the journal go: until the rename, the old snapshot plus it was the state.
    if (::ftruncate(journal_fd_, 0) != 0 || ::lseek(journal_fd_, 0, SEEK_SET) < 0 ||
        ::fsync(journal_fd_) != 0) {
      return os_error("cannot empty", path("journal"));
    }
    snapshot_bytes_ = bytes.size();
    journal_bytes_ = 0;
    dirty_ = false;
    return ok_status();
  }

  Status sync() override {
    if (!dirty_) return ok_status();
    if (::fdatasync(journal_fd_) != 0) return os_error("cannot sync", path("journal"));
    dirty_ = false;
    return ok_status();
  }

  std::uint64_t journal_bytes() const override { return journal_bytes_; }
  std::uint64_t snapshot_bytes() const override { return snapshot_bytes_; }
  std::string load_note() const override { return dropped_; }

 private:
  std::string path(const char* name) const { return dir_ + "/" + name; }

  std::string dir_;
  int lock_fd_;
  int journal_fd_ = -1;
  std::uint64_t journal_bytes_ = 0;
  std::uint64_t snapshot_bytes_ = 0;
  bool dirty_ = false;
  std::string dropped_;
};

}  // namespace

Result<std::unique_ptr<StateLog>> open_state_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Error{ErrorCode::kInternal,
                 "cannot create state directory '" + dir + "': " + ec.message()};
  }
  const std::string lock = dir + "/lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return os_error("cannot open", lock);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return Error{
        ErrorCode::kInternal,
        "state directory '" + dir + "' is in use by another ctrund (lock held on '" + lock + "')"};
  }
  return std::unique_ptr<StateLog>(std::make_unique<FileStateLog>(dir, fd));
}

}  // namespace ctrun::rendezvous
