#pragma once

// The asynchronous engine (Boost.Asio): batches deliveries from many producers onto one writer
// thread and completes each submission with its outcomes. Opt-in above the synchronous core
// <idem/idem.hpp>, which it includes; link it with the `idem-engine` pkg-config module.

#include <idem/engine/engine.hpp>
#include <idem/idem.hpp>
