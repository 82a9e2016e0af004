"""The data plane's neutral core: the messages every transport decodes into
(``messages``), what it needs of a model (``model``) and a scheduler (``scheduler``), where
a call goes (``routing``), its one deadline rule (``deadline``), the kinds of model
(``kinds``) and the steps of every row call (``row_calls``).

Nothing here imports a transport, a model kind, the control plane or the process: it finds
models through ``routing.Router`` and versions through ``model.VersionSource``."""
