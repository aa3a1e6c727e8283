// llmc/base/fileio.cpp: see fileio.h.
#include "llmc/base/fileio.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

long long file_size(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    return (long long)st.st_size;
}

bool read_text(const std::string& path, std::string* out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::ostringstream s;
    s << in.rdbuf();
    *out = s.str();
    return true;
}

bool AtomicWriter::open(const std::string& path, std::string* err) {
    path_ = path;
    tmp_ = path + ".tmp." + std::to_string((long long)getpid());
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) {
        *err = "cannot write " + tmp_ + ": " + std::strerror(errno);
        return false;
    }
    return true;
}

bool AtomicWriter::write(const void* data, size_t bytes) {
    if (!f_ || !ok_) return false;
    if (bytes && std::fwrite(data, 1, bytes, f_) != bytes) ok_ = false;
    return ok_;
}

bool AtomicWriter::commit(std::string* err) {
    if (!f_) {
        *err = "commit of an unopened file " + path_;
        return false;
    }
    bool ok = ok_ && std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
    ok = (std::fclose(f_) == 0) && ok;
    f_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        *err = "cannot write " + path_ + ": " + std::strerror(errno);
        std::remove(tmp_.c_str());
        return false;
    }
    return true;
}

AtomicWriter::~AtomicWriter() {
    if (f_) {
        std::fclose(f_);
        std::remove(tmp_.c_str());
    }
}

bool make_dirs(const std::string& dir, std::string* err) {
    std::string cur;
    for (size_t i = 0; i <= dir.size(); i++) {
        if (i == dir.size() || dir[i] == '/') {
            if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
                *err = "cannot create directory " + cur + ": " + std::strerror(errno);
                return false;
            }
        }
        if (i < dir.size()) cur += dir[i];
    }
    return true;
}
