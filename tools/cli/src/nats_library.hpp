#pragma once

// The NATS commands' last act: once a command's connections are closed and destroyed, the
// NATS library's own threads are joined and its memory freed before the process exits. A
// command declares one first, so it goes last.

#include <idem/sources/jetstream.hpp>

namespace idem::cli::detail {

struct nats_library_scope {
    nats_library_scope() = default;
    nats_library_scope(const nats_library_scope&) = delete;
    nats_library_scope& operator=(const nats_library_scope&) = delete;
    ~nats_library_scope() { (void)jetstream::close_nats_library(); }
};

}  // namespace idem::cli::detail
