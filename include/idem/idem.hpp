#pragma once

// The synchronous core of idem in one include: events and logs, projections, the store and its
// options, snapshots, deliveries and outcomes, errors. It pulls in cereal (states and events
// are serialized with it) but neither Boost.Asio nor any source's library; link it with the
// `idem` pkg-config module (or meson's dependency('idem')).
//
// The layers above the core are included on their own (docs/EMBEDDING.md, "Headers and modules"):
//   <idem/engine.hpp>        the asynchronous engine over Boost.Asio       (module idem-engine)
//   <idem/sources/...>       event logs, JetStream, HTTP as engine sources (module idem-sources)
//   <idem/testing.hpp>       the chaos test kit                            (module idem-testing)
//   <idem/cli/tool.hpp>      the `idem` command line as a library          (module idem-cli)

#include <idem/projections/backup.hpp>
#include <idem/projections/changes.hpp>
#include <idem/projections/dead_letter.hpp>
#include <idem/projections/delivery.hpp>
#include <idem/projections/explain.hpp>
#include <idem/projections/json_archive.hpp>
#include <idem/projections/message_id.hpp>
#include <idem/projections/operator_results.hpp>
#include <idem/projections/prepared_batch.hpp>
#include <idem/projections/projection.hpp>
#include <idem/projections/retention.hpp>
#include <idem/projections/snapshot.hpp>
#include <idem/projections/store.hpp>
#include <idem/projections/store_options.hpp>
#include <idem/projections/upcast.hpp>
#include <idem/storage/durability.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>
#include <idem/storage/log_position.hpp>
#include <idem/storage/page_check.hpp>
#include <idem/storage/store_dir.hpp>
#include <idem/storage/writer_lock.hpp>
