"""Image input: the image request's shape and limits (``image_request``), what an encoded
image's bytes say before a decoder reads them (``image_bytes``), the decode policy
(``images``) and the samples of a request, images or video frames (``media``).

Imports ``common.configuration`` and ``common.limits`` only."""
