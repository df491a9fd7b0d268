/* The settings page (being built). */
"use strict";
