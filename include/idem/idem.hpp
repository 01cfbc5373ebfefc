#pragma once

// The whole public surface of idem in one include.

#include <idem/projections/backup.hpp>
#include <idem/projections/projection.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>
#include <idem/engine/engine.hpp>
#include <idem/sources/compare.hpp>
#include <idem/sources/consume.hpp>
#include <idem/sources/rebuild.hpp>
