"""Installation: the services, one entry each (``registry``), what a ``run.sh`` command
installs (``install``), what ``run.sh`` reads (``shell``), whether a service can start on
this node (``preflight``) and the settings pages made from the declarations
(``settings_docs``).

Standard library only where ``run.sh`` reads it; imports ``common.pipeline`` (the scorer
contract, for types) and below, never the HTTP server."""
